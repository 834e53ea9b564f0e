"""Who may make room for a load: the refusals and the eviction order.

Pure functions of the backends' records, read by :mod:`yard.core.placement`
when a plan chooses its victims and by :mod:`yard.core.planning` when it asks
whether what a plan read still holds. The rules are placement's: room is made
only by stopping (or draining) loaded, unpinned backends not already making
room for another swap, whose waiting requests (or stand-in for work ahead) do
not rank above the request that needs the room, and never by another instance
of the backend being loaded for no request (an operator's pin or load) or for
work ahead (one instance never makes room for another: the routing binds no
request where it would, and a wish to load or an announcement does not either).
"""

from __future__ import annotations

import math

from yard.core import reasons
from yard.core.lifecycle import LOADED
from yard.core.queue import Req, order_key
from yard.core.records import Backend

Key = tuple[float, float, str]
"""A request's :func:`~yard.core.queue.order_key`."""


def evict_key(o: Backend) -> tuple[bool, bool, float, float, float, str]:
    """Eviction order: idle before busy, nobody waiting before waited for, then
    the least reload time its requests cost per GiB freed (:func:`demand`), then
    the lowest GreedyDual-Size credit, the longest unused, the name."""
    waited = o.queue.size > 0 or o.ahead is not None
    return (o.busy(), waited, demand(o), o.credit, o.last_used, o.name)


def demand(o: Backend) -> float:
    """What evicting ``o`` is expected to cost, per GiB it frees, as a log that
    orders backends alike at any time: its recent arrival rate (decayed over
    :data:`~yard.core.records.ARRIVAL_MEMORY_S`: each arrival after an
    eviction is a reload) times its reload seconds per GiB held. A backend in
    use every few seconds goes after one idle for twenty minutes, however cheap
    it is to reload; among backends as much in use, the cheapest per GiB goes
    first. Where ``o`` may load on another GPU as well, its eviction may be a
    move that costs one reload and evicts nothing there: such backends go
    first (-inf), ordered by GreedyDual-Size credit alone."""
    if o.places > 1:
        return -math.inf
    return o.heat + o.reload_log


def family_of(b: Backend, head: Req | None) -> str | None:
    """The backend whose instances may not make room for ``b``'s load for
    ``head``: ``b``'s own (its first instance's name) where the load is for no
    request (an operator's pin or load: ``head`` None) or for work ahead (its
    stand-in); None where a request waits for it (one sent to this instance by
    name may make room as for any backend: the routing binds none where it
    does not fit beside its siblings), or where ``b`` has no siblings."""
    return b.family if head is None or head is b.ahead else None


def refusal(
    o: Backend, o_head: Req | None, b: Backend, head: Req | None, taken: set[str], boost: float
) -> str | None:
    """Why ``o`` (whose best waiting request is ``o_head``) may not make room
    for ``b``'s load for ``head`` (None: it may)."""
    o_key = None if o_head is None else order_key(o_head, boost)
    head_key = None if head is None else order_key(head, boost)
    return refusal_by_key(o, o_head, o_key, head_key, taken, family_of(b, head))


def refusal_by_key(
    o: Backend,
    o_head: Req | None,
    o_key: Key | None,
    head_key: Key | None,
    taken: set[str] | frozenset[str],
    family: str | None,
) -> str | None:
    """:func:`refusal` with the requests' :func:`~yard.core.queue.order_key`
    given (``o_key`` of ``o_head``, ``head_key`` of the request that needs the
    room; None for none) and the ``family`` whose instances may not make room
    (:func:`family_of`), so that one backend can be
    asked about many. For one ``o``, the answer depends on ``head_key`` only
    through :func:`outranks`, on ``taken`` only through whether it holds ``o``
    and on ``family`` only through whether it is ``o``'s."""
    if o.pinned:
        return reasons.not_a_victim_pinned(o.name)
    if o.state not in LOADED:
        return reasons.not_a_victim_state(o.name, o.state.value)
    if family is not None and o.family == family:
        return reasons.not_a_victim_sibling(o.name)
    if o.name in taken:
        return reasons.not_a_victim_taken(o.name)
    if outranks(o_key, head_key):
        if o_head is o.ahead:
            return o.ahead_keep_why
        return reasons.not_a_victim_outranks(o.name)
    return None


def outranks(o_key: Key | None, head_key: Key | None) -> bool:
    """Whether a backend's best waiting request (order key ``o_key``; None:
    none waits) ranks above the request that needs the room (``head_key``;
    None: a load nobody waits for)."""
    return o_key is not None and (head_key is None or o_key < head_key)

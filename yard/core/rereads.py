"""Which plans of the last round must be planned again when a backend they
read changed (:class:`yard.core.planning.Planner`'s invalidation, the reading
part): a plan reads of another backend whether it refuses to take it
(:func:`~yard.core.victims.refusal_by_key`) and its place in eviction orders.

Both functions only read; they add the indexes of the plans to plan again to
the set they are given.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from yard.core.plan_steps import Key, Step, still_reads
from yard.core.plans import Reads
from yard.core.records import Backend
from yard.core.victims import refusal_by_key

_LOWEST: Key = (-math.inf, -math.inf, "")
"""Below every :func:`~yard.core.queue.order_key`."""


def reread(
    planned: list[Step],
    o: Backend,
    key: Key | None,
    steps: Iterable[int],
    dirty: set[int],
    *,
    refused: bool,
) -> None:
    """Add to ``dirty`` the ``steps`` (indexes into ``planned``) whose plan
    would read ``o`` (whose best waiting request has order key ``key``)
    otherwise now: its refusal (if ``refused``), else its place in their
    eviction orders."""
    o_head = o.head()
    name = o.name
    if not refused:
        for k in steps:
            if k not in dirty and not still_reads(planned[k], o, o_head, key, False, True):
                dirty.add(k)
        return
    # The answer differs between plans only by whether they took o, whether
    # o outranks their head and is their sibling (refusal_by_key): asked once each.
    answers: dict[tuple[bool, bool, bool], str | None] = {}
    o_family = o.family
    for k in steps:
        if k in dirty:
            continue
        st = planned[k]
        if name not in st.why:
            continue
        taken = st.before.taken
        # family_of and outranks, inline: this runs for every reader of o
        family = st.backend.family
        if family is not None and not (st.head is None or st.head is st.backend.ahead):
            family = None
        sibling = family is not None and o_family == family
        head_key = st.head_key
        which = (
            name in taken,
            key is not None and (head_key is None or key < head_key),
            sibling,
        )
        if which in answers:
            why = answers[which]
        else:
            why = answers[which] = refusal_by_key(o, o_head, key, st.head_key, taken, family)
        if why != st.why[name]:
            dirty.add(k)


def between(
    ranks: list[tuple[int, Key]], readers: set[int], old: Key | None, new: Key | None
) -> list[int]:
    """The ``readers`` whose refusal of a backend may change when the order
    key of its best waiting request goes from ``old`` to ``new`` (nothing
    else of it changed): a plan refuses it as outranking exactly when the
    plan's head ranks after it (:func:`~yard.core.victims.refusal_by_key`),
    so only the plans whose head ranks between the two can answer
    otherwise. ``ranks``: the round's steps' ranks, in order. Those ranked
    first by a wish to load (not by their head) are always among them."""
    first = bisect_left(ranks, (1, _LOWEST))
    if old is None or new is None:
        key = new if old is None else old
        assert key is not None
        lo, hi = bisect_right(ranks, (1, key)), len(ranks)
    else:
        lo = bisect_right(ranks, (1, min(old, new)))
        hi = bisect_right(ranks, (1, max(old, new)))
    if len(readers) <= first + hi - lo:
        return [k for k in readers if k < first or lo <= k < hi]
    return [k for k in itertools.chain(range(first), range(lo, hi)) if k in readers]


def index_reads(
    steps: list[Step],
) -> tuple[dict[str, set[int]], dict[str, set[int]], dict[str, set[int]], set[int], list[int]]:
    """The indexes of a round's ``steps`` by what they read: the backends each
    considered (readers), those in its eviction orders (orderers), the devices
    it weighed (weighers), and the steps that evict; and the steps that change
    the frontier (booked, claimed or took), in order. Plans told again share
    their reads (and what was drawn from them): each reads is indexed once,
    with all the steps that share it."""
    shared: dict[Reads, tuple[Step, list[int]]] = {}
    effects: list[int] = []
    last: Reads | None = None
    ks: list[int] = []
    for k, st in enumerate(steps):
        if st.after is not None:
            effects.append(k)
        reads = st.reads
        if reads is not last:  # told plans come in runs: looked up once a run
            group = shared.get(reads)
            if group is None:
                ks = [k]
                shared[reads] = (st, ks)
                last = reads
                continue
            ks = group[1]
            last = reads
        ks.append(k)
    readers: dict[str, set[int]] = {}
    orderers: dict[str, set[int]] = {}
    weighers: dict[str, set[int]] = {}
    evicting: set[int] = set()
    for st, ks in shared.values():
        those = set(ks)
        for name in st.names:
            _note(readers, name, those)
        for name in st.ordered:
            _note(orderers, name, those)
        for device in st.reads.devices:
            _note(weighers, device, those)
        if st.reads.evicts:
            evicting |= those
    return readers, orderers, weighers, evicting, effects


def _note(index: dict[str, set[int]], key: str, steps: set[int]) -> None:
    """Add ``steps`` to ``index[key]`` (a set of its own)."""
    known = index.get(key)
    if known is None:
        index[key] = steps.copy()
    else:
        known |= steps


def reindex_fresh(
    old: list[Step],
    steps: list[Step],
    fresh: list[int],
    readers: dict[str, set[int]],
    orderers: dict[str, set[int]],
    weighers: dict[str, set[int]],
    evicting: set[int],
) -> bool:
    """Move the ``fresh`` steps (planned anew in a round of the same steps:
    ``old[k]`` became ``steps[k]``) in the indexes of :func:`index_reads`;
    whether any of them changed whether it books, claims or takes."""
    effects_changed = False
    for k in fresh:
        before, now = old[k], steps[k]
        if before is now:
            continue  # the same step kept (its sentence told again): indexed as it is
        if before.names != now.names:
            for name in before.names - now.names:
                readers[name].discard(k)
            for name in now.names - before.names:
                readers.setdefault(name, set()).add(k)
        if before.ordered != now.ordered:
            for name in before.ordered - now.ordered:
                orderers[name].discard(k)
            for name in now.ordered - before.ordered:
                orderers.setdefault(name, set()).add(k)
        if before.reads.devices != now.reads.devices:
            for device in before.reads.devices - now.reads.devices:
                weighers[device].discard(k)
            for device in now.reads.devices - before.reads.devices:
                weighers.setdefault(device, set()).add(k)
        if now.reads.evicts:
            evicting.add(k)
        else:
            evicting.discard(k)
        effects_changed = effects_changed or (before.after is None) != (now.after is None)
    return effects_changed

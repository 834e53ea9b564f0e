"""The records of a plan (:mod:`yard.core.placement` makes them, the planner
carries them out): what it says (:class:`Outcome`, :class:`Plan`), who holds
what on each device in a round (:class:`Room`), and what a plan read that can
change without a change of states or memory (:class:`Reads`), so that a later
round can tell whether it still holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from yard.core import reasons
from yard.core.queue import Req
from yard.core.records import Backend


class Outcome(IntEnum):
    """What a plan says, best first."""

    START = 0
    """It fits now: start it."""
    WAIT = 1
    """Memory is being freed, or another load runs there; nothing to add."""
    EVICT = 2
    """Stop or drain other backends first."""
    BLOCKED = 3
    """Room cannot be made now."""


@dataclass(slots=True, eq=False)
class Plan:
    """Where ``backend`` would load (``gpus``) and what that takes."""

    backend: Backend
    gpus: tuple[str, ...]
    status: Outcome
    reason: str
    need: Mapping[str, int] = field(default_factory=dict)
    stop: list[Backend] = field(default_factory=list)
    drain: list[Backend] = field(default_factory=list)
    pending: list[Backend] = field(default_factory=list)
    cost: float = 0.0
    slack: int = 0
    free_wait_s: float = 0.0
    room: str = ""
    context: int | None = None
    parallel: int | None = None
    hold_until: float | None = None
    """Where the load is for an urgent window ahead whose load is not yet due:
    when it is (until then its idle victims are held, not stopped)."""
    made_room: tuple[list[Backend], dict[str, int]] | None = None
    """An evicting plan's victims as chosen and each device's free memory then:
    what :func:`~yard.core.placement.evict_again` works it out again from."""
    retell: Callable[[str], str] | None = None
    """For a blocked plan, or one that waits for another load: its reason told
    of another backend by name (one with the same options that, after the same
    frontier, meets the same checks and refusals; see :mod:`yard.core.planning`)."""
    parts: tuple[list[str], list[tuple[int, str]]] | None = None
    """An evicting plan's sentence parts, and which of them tell a victim that
    serves more first by its swap head's overtakes (index, victim): what
    :func:`~yard.core.reworks.overtaken_again` tells again as they change."""

    def key(self) -> tuple[int, bool, float, int, tuple[str, ...]]:
        busy = bool(self.drain or self.pending)
        return (self.status, busy, self.cost, -self.slack, self.gpus)

    @property
    def victims(self) -> list[Backend]:
        return self.stop + self.drain + self.pending


@dataclass(frozen=True, slots=True)
class NoRoom:
    """The reason of a plan blocked for want of room, told of a backend by
    name; equal ones tell the same backend the same sentence."""

    device: str
    need: int
    free: int
    blockers: tuple[str, ...]

    def __call__(self, name: str) -> str:
        return reasons.no_room(self.device, name, self.need, self.free, self.blockers)


@dataclass(slots=True, eq=False)
class Room:
    """Who holds what on each device, for one planning round.

    occupants: the backends loaded, loading or stopping there.
    used: bytes they hold (reservation or live use, whichever is higher).
    freeing: bytes held by backends that are stopping.
    loading: the backend loading there, if any.
    held: per backend, bytes held on each of its devices.
    heads: per occupying backend, its best waiting request (None: none waits).
    evict_order: occupying backends, the first to go first.
    """

    occupants: dict[str, list[Backend]] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    freeing: dict[str, int] = field(default_factory=dict)
    loading: dict[str, Backend] = field(default_factory=dict)
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    heads: dict[str, Req | None] = field(default_factory=dict)
    evict_order: list[Backend] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Reads:
    """What a plan read that can change without a change of states or memory.

    refusals: each backend it considered as a victim, and why it refused it
        (None: it did not); :func:`~yard.core.victims.refusal` tells it again.
    orders: for each option, the backends it went through in eviction order,
        in that order.
    evicts: it chose victims (``victims``), whose queues, slots and service
        times decide how they make room.
    until: the latest time at which its swap batching still holds (a victim's
        request would no longer end before the swap's latest start after it).
    devices: the devices whose memory figures it weighed (their names), and
        those where it asked whether a load runs (:func:`~yard.core.placement.loading` of them).
    plans: where it evicts, the plan of each option.
    """

    refusals: list[tuple[Backend, str | None]] = field(default_factory=list)
    orders: list[list[Backend]] = field(default_factory=list)
    evicts: bool = False
    victims: set[str] = field(default_factory=set)
    until: float = math.inf
    devices: set[str] = field(default_factory=set)
    plans: list[Plan] = field(default_factory=list)
    """Evicting: each option's plan (:func:`~yard.core.placement.evict_options_again`)."""

    def backends(self) -> frozenset[str]:
        names = {o.name for o, _ in self.refusals}
        for order in self.orders:
            names.update(o.name for o in order)
        return frozenset(names)

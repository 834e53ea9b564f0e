"""The records of work ahead (held requests, announcements) the core keeps.

:mod:`yard.core.windows` holds the rules; this module only the data, so that
:class:`~yard.core.state.Core` can hold it and tell its timers' liveness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from yard.core.events import RequestArrived
from yard.core.queue import Req, ReqState
from yard.core.timers import Timer

__all__ = ["Kind", "Window", "Windows"]

Kind = Literal["held", "announced"]


@dataclass(slots=True, eq=False)
class Window:
    """One window of work ahead for a backend.

    opens, closes: engine times; a held request's window closes when it opens.
    left: requests still expected (a held request: 1).
    stand_in: what planning ranks it by while it is near.
    gave_up: its backend failed to start while it was near.
    spread: the stand-ins of the further instances of its backend readied for
        it too (:func:`yard.core.instances.spread`), by instance.
    gave_up_on: the further instances that failed to start while it was near.
    """

    id: str
    kind: Kind
    app: str
    backend: str
    opens: float
    closes: float
    priority: float
    left: int
    used: int
    label: str
    stand_in: Req
    gave_up: bool = False
    early: bool = False  # its backend was let load early for it once (yard.core.early.early_at)
    early_check: float = -math.inf  # when to ask that again
    spread: dict[str, Req] = field(default_factory=dict)
    gave_up_on: set[str] = field(default_factory=set)


@dataclass(slots=True, eq=False)
class Windows:
    """The core's windows: held requests' arrivals, announcements, timers' tokens."""

    held: dict[str, RequestArrived] = field(default_factory=dict)
    announced: dict[str, Window] = field(default_factory=dict)
    by_backend: dict[str, dict[str, Window]] = field(default_factory=dict)
    ahead_at: dict[str, float] = field(default_factory=dict)  # backend -> its AHEAD timer
    ahead_token: dict[str, int] = field(default_factory=dict)

    def held_count(self) -> int:
        return len(self.held)

    def live(self, kind: Timer, key: str, token: int, requests: dict[str, Req]) -> bool:
        """Whether a ``HOLD``, ``AHEAD`` or ``CLOSE`` timer still matters."""
        if kind is Timer.CLOSE:
            return key in self.announced
        if kind is Timer.AHEAD:
            return self.ahead_token.get(key) == token
        req = requests.get(key)
        return req is not None and req.gen == token and req.state is ReqState.HELD

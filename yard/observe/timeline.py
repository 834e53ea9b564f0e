"""The dashboard's timeline: per device, what was loaded and serving over the
last hour, and the work announced or held ahead.

Three parts:

- :class:`History` records what each backend did (loading, loaded, serving,
  stopping), fed by :meth:`yard.engine.Engine.watch` with every event and
  decision at its exact engine time. It keeps the last ``horizon_s`` seconds,
  at most ``limit`` finished spans (the oldest go first).
- :func:`build` joins that history with the core's windows ahead
  (``Snapshot.windows``) into one JSON-ready document (``GET /admin/timeline``).
- :func:`yard.observe.timeline_svg.render_svg` draws that document.

Serving is "at least one request in flight"; pauses shorter than ``JOIN_S``
are not shown. Requests that were already in flight when the history began
are not known, so not drawn.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from yard.core.decisions import Decision, Dispatch, Reject, Requeue, StartBackend, StopBackend
from yard.core.events import (
    BackendExited,
    BackendReady,
    BackendStartFailed,
    BackendStopped,
    Event,
    RequestCancelled,
    RequestFinished,
)
from yard.core.spec import HOST

if TYPE_CHECKING:
    from yard.core.views import Snapshot
    from yard.engine import LoggedDecision

Json = dict[str, Any]

HORIZON_S = 3600.0
"""How far back the timeline looks."""

SPAN_LIMIT = 5000
"""Most finished spans kept (all backends together)."""

JOIN_S = 5.0
"""Serving stretches of one backend less than this apart are drawn as one
(about a pixel of the picture): a backend busy with one short request after
another is one bar, and the history does not fill up with slivers."""

AHEAD_MIN_S = 900.0
"""The timeline shows at least this far ahead when work is announced or held."""

PAST_MIN_S = 120.0
"""The past the timeline shows at least: it zooms to the activity it has,
from this much up to its whole history (an hour), so that the last minutes
are not squeezed into a sliver of an hour."""

AHEAD_MAX_S = 7200.0
"""... and at most this far: windows further ahead are only counted."""

KINDS = ("loading", "loaded", "serving", "stopping")
"""What a span of a backend's history can be."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One stretch of a backend's history.

    kind: ``loading`` (start to ready), ``loaded`` (ready to stop), ``serving``
        (requests in flight, inside ``loaded``), ``stopping`` (stop to gone).
    devices: where it was (``host`` for a backend without GPUs).
    end: engine time it ended; None while it goes on.
    note: what a person should know (how it ended, how busy it was).
    """

    backend: str
    kind: str
    devices: tuple[str, ...]
    start: float
    end: float | None
    note: str = ""


@dataclass(slots=True)
class _Open:
    start: float
    devices: tuple[str, ...]
    most: int = 0  # serving: most requests in flight at once
    served: int = 0  # serving: requests that ended in it
    idle_from: float | None = None  # serving: none in flight since (it may go on)


class History:
    """What each backend did, span by span; see the module docstring.

    Feed it with :meth:`see` (an :meth:`Engine.watch` callback). It never
    raises on events it does not expect (a ready without a start, a finish of
    a request it never saw dispatched): it records what it can.
    """

    def __init__(self, *, horizon_s: float = HORIZON_S, limit: int = SPAN_LIMIT) -> None:
        self.horizon_s = horizon_s
        self._done: deque[Span] = deque(maxlen=limit)
        self._open: dict[tuple[str, str], _Open] = {}
        self._where: dict[str, tuple[str, ...]] = {}
        self._running: dict[str, str] = {}  # request id -> backend
        self._inflight: dict[str, int] = {}

    # -- feeding it ------------------------------------------------------------

    def see(self, at: float, item: Event | Decision) -> None:
        """Take one event or decision the engine saw at engine time ``at``."""
        if type(item) not in _TRACKED:  # most events (arrivals, ticks, memory)
            return
        match item:
            case Dispatch():
                self._dispatched(at, item.request_id, item.backend)
            case RequestFinished():
                self._ended(at, item.request_id, served=True)
            case RequestCancelled() | Requeue() | Reject():
                self._ended(at, item.request_id, served=False)
            case StartBackend():
                self._close_all(at, item.backend, "")
                devices = item.gpus or (HOST,)
                self._where[item.backend] = devices
                self._begin(at, item.backend, "loading")
            case BackendReady():
                self._close(at, item.backend, "loading", "")
                self._begin(at, item.backend, "loaded")
            case BackendStartFailed():
                self._close_all(at, item.backend, f"failed to start: {item.detail}")
            case StopBackend():
                self._close_all(at, item.backend, f"stopped: {item.reason}")
                self._begin(at, item.backend, "stopping")
            case BackendExited():
                code = "" if item.exit_code is None else f" with code {item.exit_code}"
                oom = ", out of memory" if item.oom else ""
                self._close_all(at, item.backend, f"exited{code}{oom}")
            case BackendStopped():
                self._close_all(at, item.backend, "")

    def seed(self, snapshot: Snapshot, logged: Sequence[LoggedDecision]) -> None:
        """Start from what the engine shows now for backends the history knows
        nothing of yet (it was attached after they were started): loads from
        the decision log, ready times from the snapshot."""
        starts: dict[str, LoggedDecision] = {}
        stops: dict[str, LoggedDecision] = {}
        for entry in logged:
            decision = entry.decision
            if isinstance(decision, StartBackend):
                starts[decision.backend] = entry
            elif isinstance(decision, StopBackend):
                stops[decision.backend] = entry
        now = snapshot.now
        for view in snapshot.backends:
            name = view.name
            if name in self._where or view.state in ("stopped", "failed"):
                continue
            start = starts.get(name)
            devices = view.gpus or (HOST,)
            if start is not None and isinstance(start.decision, StartBackend):
                devices = start.decision.gpus or (HOST,)
            self._where[name] = devices
            began = start.at if start is not None else now
            if view.state == "starting":
                self._open[(name, "loading")] = _Open(began, devices)
            elif view.state == "stopping":
                stop = stops.get(name)
                self._open[(name, "stopping")] = _Open(stop.at if stop else now, devices)
            else:
                ready = view.loaded_at if view.loaded_at is not None else now
                if start is not None and start.at <= ready:
                    self._done.append(
                        Span(
                            backend=name, kind="loading", devices=devices, start=start.at, end=ready
                        )
                    )
                self._open[(name, "loaded")] = _Open(ready, devices)

    # -- reading it ------------------------------------------------------------

    def spans(self, now: float) -> list[Span]:
        """Every span that reaches into the last ``horizon_s`` seconds, by
        start; the ones still going have ``end`` None."""
        since = now - self.horizon_s
        while self._done and (self._done[0].end or now) < since:
            self._done.popleft()
        out = [s for s in self._done if s.end is None or s.end >= since]
        for (backend, kind), span in self._open.items():
            out.append(
                Span(
                    backend=backend,
                    kind=kind,
                    devices=span.devices,
                    start=span.start,
                    end=span.idle_from,
                    note=_busy_note(span),
                )
            )
        out.sort(key=lambda s: (s.start, KINDS.index(s.kind), s.backend))
        return out

    def where(self, backend: str) -> tuple[str, ...] | None:
        """The devices ``backend`` was last seen on (None: never seen)."""
        return self._where.get(backend)

    # -- the spans -------------------------------------------------------------

    def _begin(self, at: float, backend: str, kind: str) -> None:
        devices = self._where.get(backend, (HOST,))
        self._open[(backend, kind)] = _Open(at, devices)

    def _close(self, at: float, backend: str, kind: str, note: str) -> None:
        span = self._open.pop((backend, kind), None)
        if span is None:
            return
        if kind == "serving":
            note = _busy_note(span)
            if span.idle_from is not None:
                at = span.idle_from
        self._done.append(
            Span(
                backend=backend,
                kind=kind,
                devices=span.devices,
                start=span.start,
                end=at,
                note=note,
            )
        )

    def _close_all(self, at: float, backend: str, note: str) -> None:
        for kind in KINDS:
            self._close(at, backend, kind, note)
        self._inflight.pop(backend, None)
        for rid in [r for r, b in self._running.items() if b == backend]:
            del self._running[rid]

    def _dispatched(self, at: float, request_id: str, backend: str) -> None:
        self._running[request_id] = backend
        count = self._inflight.get(backend, 0) + 1
        self._inflight[backend] = count
        span = self._open.get((backend, "serving"))
        if span is not None and span.idle_from is not None:
            if at - span.idle_from < JOIN_S:
                span.idle_from = None
            else:
                self._close(at, backend, "serving", "")
                span = None
        if span is None:
            span = self._open[(backend, "serving")] = _Open(at, self._where.get(backend, (HOST,)))
        span.most = max(span.most, count)

    def _ended(self, at: float, request_id: str, *, served: bool) -> None:
        backend = self._running.pop(request_id, None)
        if backend is None:
            return
        count = self._inflight.get(backend, 1) - 1
        span = self._open.get((backend, "serving"))
        if span is not None and served:
            span.served += 1
        if count > 0:
            self._inflight[backend] = count
            return
        self._inflight.pop(backend, None)
        if span is not None:
            span.idle_from = at  # ends here unless the next comes within JOIN_S


_TRACKED = frozenset(
    {
        Dispatch,
        RequestFinished,
        RequestCancelled,
        Requeue,
        Reject,
        StartBackend,
        BackendReady,
        BackendStartFailed,
        StopBackend,
        BackendExited,
        BackendStopped,
    }
)


def _busy_note(span: _Open) -> str:
    if not span.most:
        return ""
    return f"up to {span.most} in flight, {span.served} served"


# -- the document ---------------------------------------------------------------


def _wall(t: float, now: float, wall_now: float) -> float:
    return wall_now + (t - now)


def clock(wall: float) -> str:
    """A wall-clock time as people read it on the timeline: ``13:50:07Z``."""
    return datetime.fromtimestamp(wall, UTC).strftime("%H:%M:%SZ")


def build(
    history: History,
    snapshot: Snapshot,
    *,
    models: Mapping[str, Sequence[str]] | None = None,
    placements: Mapping[str, Sequence[str]] | None = None,
    wall_now: float | None = None,
) -> Json:
    """The timeline as JSON-ready data.

    models: backend -> the model names it serves (labels say the model).
    placements: backend -> the GPUs it may be placed on (configuration), for
        windows of a backend not seen loaded within the hour.
    wall_now: the wall-clock time of ``snapshot.now`` (default ``time.time()``).

    ``devices`` lists every device of the snapshot (and, if needed, rows
    such as ``gpu0|gpu1`` for backends not placed yet), each with one lane
    per backend: its ``spans`` (past, end None while going on) and its
    ``windows`` ahead (``held`` or ``announced``). Times are engine times,
    each with its ``*_wall`` twin (epoch seconds).
    """
    models = models or {}
    placements = placements or {}
    now = snapshot.now
    wall = time.time() if wall_now is None else wall_now
    spans = history.spans(now)
    # Zoomed to the activity: back to the first span shown, in whole minutes
    # (5-minute steps past ten minutes).
    first = min((s.start for s in spans), default=now)
    step = 60.0 if now - first <= 600.0 else 300.0
    past = min(history.horizon_s, max(PAST_MIN_S, math.ceil((now - first) / step) * step))
    start = now - past
    shown = [w for w in snapshot.windows if w.closes >= now or w.kind == "held"]
    inside = [w for w in shown if w.opens <= now + AHEAD_MAX_S]
    furthest = max((max(w.closes, w.opens) - now for w in inside), default=0.0)
    if inside:
        ahead = min(AHEAD_MAX_S, max(AHEAD_MIN_S, math.ceil(furthest / 300.0) * 300.0))
    else:
        ahead = past / 6  # nothing ahead: a margin after "now", not an empty quarter hour
    end = now + ahead

    rows: dict[str, dict[str, Json]] = {d.name: {} for d in snapshot.devices}

    def lane(device: str, backend: str) -> Json:
        lanes = rows.setdefault(device, {})
        if backend not in lanes:
            names = list(models.get(backend, ()))
            lanes[backend] = {"backend": backend, "models": names, "spans": [], "windows": []}
        return lanes[backend]

    for span in spans:
        for device in span.devices:
            lane(device, span.backend)["spans"].append(
                {
                    "kind": span.kind,
                    "start": span.start,
                    "end": span.end,
                    "start_wall": _wall(span.start, now, wall),
                    "end_wall": None if span.end is None else _wall(span.end, now, wall),
                    "note": span.note,
                }
            )
    for window in inside:
        devices = history.where(window.backend)
        if devices is None:
            gpus = tuple(placements.get(window.backend, ()))
            devices = ("|".join(gpus),) if gpus else (HOST,)
        entry = {
            "id": window.id,
            "kind": window.kind,
            "app": window.app,
            "priority": window.priority,
            "left": window.left,
            "label": window.label,
            "opens": window.opens,
            "closes": window.closes,
            "loads_from": window.loads_from,
            "opens_wall": _wall(window.opens, now, wall),
            "closes_wall": _wall(window.closes, now, wall),
            "loads_from_wall": _wall(window.loads_from, now, wall),
        }
        for device in devices:
            lane(device, window.backend)["windows"].append(entry)
    return {
        "now": now,
        "wall_now": wall,
        "start": start,
        "end": end,
        "start_wall": _wall(start, now, wall),
        "end_wall": _wall(end, now, wall),
        "devices": [
            {"name": name, "lanes": [lanes[b] for b in sorted(lanes)]}
            for name, lanes in rows.items()
        ],
        "beyond": len(shown) - len(inside),
    }

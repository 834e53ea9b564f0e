"""Baseline policies: what yard is compared against, driven by the same engine.

Each has the scheduler's shape (``handle(event, now) -> decisions``,
``next_wakeup()``), so a comparison differs only in the policy. They know each
model's declared size (its resident footprint once loaded, as a user would write it
in a config) and nothing else: no measured peaks, no growth after the first request,
no foreign memory, no deadlines.

All three work like Ollama's scheduler (``server/sched.go``, ``processPending``):
requests are taken first come, first served and handed to their backend's process,
which serves them as its slots free up (a loading backend holds them until it is
ready). A request whose model must be loaded and does not fit makes room by stopping
backends; while it waits for them to go (busy ones finish what they were handed
first), it blocks every request behind it. They differ in what fits and what goes:

- ``llama-swap``: llama-swap's default: one model at a time. A request for another
  model stops everything else, then starts its own.
- ``lru``: FIFO with least-recently-used eviction by size: declared sizes must fit
  on a GPU; the least recently used backends go first until it fits.
- ``ollama``: Ollama-like: as ``lru``, but at most 3 models loaded, each stopped after
  5 minutes idle (keep-alive); to make room it stops the idle backend whose keep-alive
  ends soonest, and waits for a busy one only if none is idle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from yard.core.decisions import Decision, Dispatch, Reject, StartBackend, StopBackend
from yard.core.events import (
    BackendExited,
    BackendReady,
    BackendStartFailed,
    BackendStopped,
    Event,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
)
from yard.core.spec import BackendSpec, DeviceSpec, Profile
from yard.core.views import BackendView, DeviceView, QueuedView, Snapshot


@dataclass(slots=True, eq=False)
class _Req:
    id: str
    backend: str
    handed: bool = False  # handed to its backend (waits for a slot there)


class Baseline:
    """Shared bookkeeping and the first-come-first-served loop; subclasses say what
    fits (:meth:`_fit`) and what goes to make room (:meth:`_victims`)."""

    name = "baseline"

    def __init__(
        self,
        devices: Sequence[DeviceSpec],
        backends: Sequence[BackendSpec],
        sizes: Mapping[str, int],
    ) -> None:
        self.devices = {d.name: d for d in devices if d.kind == "gpu"}
        self.capacity = {d.name: d.usable_bytes for d in self.devices.values()}
        self.specs = {b.name: b for b in backends}
        self.sizes = dict(sizes)
        self.pending: deque[_Req] = deque()
        self.queues: dict[str, deque[_Req]] = {b.name: deque() for b in backends}
        self.queued: dict[str, _Req] = {}
        self.running: dict[str, str] = {}
        self.state: dict[str, str] = {b.name: "stopped" for b in backends}
        self.placed: dict[str, tuple[str, ...]] = {}
        self.inflight: dict[str, int] = {b.name: 0 for b in backends}
        self.draining: set[str] = set()
        self.last_used: dict[str, float] = {b.name: 0.0 for b in backends}

    # -- the scheduler's shape ---------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Decision]:
        out: list[Decision] = []
        kind = type(event)
        if kind is RequestArrived:
            assert isinstance(event, RequestArrived)
            self._arrived(event, out)
        elif kind is RequestFinished:
            assert isinstance(event, RequestFinished)
            backend = self.running.pop(event.request_id, None)
            if backend is not None:
                self.inflight[backend] -= 1
                self.last_used[backend] = now
                if event.outcome == "upstream_lost":
                    out.append(_failed(event.request_id, backend, f"backend {backend} failed"))
        elif kind is RequestCancelled:
            assert isinstance(event, RequestCancelled)
            req = self.queued.pop(event.request_id, None)
            if req is not None:
                (self.queues[req.backend] if req.handed else self.pending).remove(req)
            else:
                backend = self.running.pop(event.request_id, None)
                if backend is not None:
                    self.inflight[backend] -= 1
                    self.last_used[backend] = now
        elif kind is BackendReady:
            assert isinstance(event, BackendReady)
            self.state[event.backend] = "ready"
            self.last_used[event.backend] = now
        elif kind is BackendStartFailed or kind is BackendExited:
            assert isinstance(event, BackendStartFailed | BackendExited)
            # What it was handed fails with it, as in Ollama.
            self._gone(event.backend)
            queue = self.queues[event.backend]
            while queue:
                req = queue.popleft()
                del self.queued[req.id]
                out.append(_failed(req.id, event.backend, f"backend {event.backend} failed"))
        elif kind is BackendStopped:
            assert isinstance(event, BackendStopped)
            self._gone(event.backend)
        out.extend(self.schedule(now))
        return out

    def next_wakeup(self) -> float | None:
        return None

    def snapshot(self, now: float, limit: int = 200) -> Snapshot:
        backends = tuple(
            BackendView(
                name=name,
                state=self.state[name],
                gpus=self.placed.get(name, ()),
                inflight=self.inflight[name],
                slots=spec.slots,
                served=0,
                loaded_at=None,
                pinned=False,
                profile=None,
                last_load_s=None,
                reason=self.name,
                queued=len(self.queues[name]),
            )
            for name, spec in self.specs.items()
        )
        devices = tuple(
            DeviceView(
                name=d.name,
                kind=d.kind,
                total_bytes=d.total_bytes,
                reserve_bytes=d.reserve_bytes,
                committed_bytes=self._used(d.name),
            )
            for d in self.devices.values()
        )
        return Snapshot(
            now=now, devices=devices, backends=backends, queue=(), queue_length=len(self.queued)
        )

    def explain(self, request_id: str, now: float) -> QueuedView | None:
        return None

    def profile(self, backend: str) -> Profile | None:
        return None

    # -- the loop ------------------------------------------------------------------------

    def schedule(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        self._expire(now, out)
        for backend, queue in self.queues.items():
            if queue and self.state[backend] == "ready":
                self._serve(backend, out)
            if backend in self.draining and self.inflight[backend] == 0 and not queue:
                self._stop(backend, "making room", out)
        pending = self.pending
        while pending:
            req = pending[0]
            backend = req.backend
            state = self.state[backend]
            if state in ("ready", "starting"):
                self._hand(pending.popleft(), out)
                continue
            if state == "stopping" or self.draining or "stopping" in self.state.values():
                return out  # wait for the unload it (or an earlier request) started
            gpus = self._fit(backend)
            if gpus is not None:
                self._start(backend, gpus, out)
                self._hand(pending.popleft(), out)
                continue
            for victim in self._victims(backend):
                if self.inflight[victim] == 0 and not self.queues[victim]:
                    self._stop(victim, f"making room for {backend}", out)
                else:
                    self.draining.add(victim)
            return out
        return out

    def _fit(self, backend: str) -> tuple[str, ...] | None:
        raise AssertionError("a baseline says what fits")

    def _victims(self, backend: str) -> list[str]:
        raise AssertionError("a baseline says what goes")

    def _expire(self, now: float, out: list[Decision]) -> None:
        return None

    # -- helpers ---------------------------------------------------------------------

    def _arrived(self, event: RequestArrived, out: list[Decision]) -> None:
        spec = self.specs.get(event.backend)
        if spec is None:
            out.append(
                Reject(
                    reason="unknown backend",
                    request_id=event.request_id,
                    status=404,
                    code="model_not_found",
                    message=f"no backend {event.backend}",
                )
            )
            return
        if self.sizes[event.backend] > max(self.capacity[g] for g in spec.gpus):
            out.append(
                Reject(
                    reason="larger than any GPU",
                    request_id=event.request_id,
                    status=413,
                    code="does_not_fit",
                    message=f"{event.backend} does not fit on any GPU",
                )
            )
            return
        req = _Req(event.request_id, event.backend)
        self.queued[req.id] = req
        self.pending.append(req)

    def _hand(self, req: _Req, out: list[Decision]) -> None:
        req.handed = True
        self.queues[req.backend].append(req)
        if self.state[req.backend] == "ready":
            self._serve(req.backend, out)

    def _serve(self, backend: str, out: list[Decision]) -> None:
        queue = self.queues[backend]
        slots = self.specs[backend].slots
        while queue and self.inflight[backend] < slots:
            req = queue.popleft()
            del self.queued[req.id]
            self.running[req.id] = backend
            self.inflight[backend] += 1
            out.append(Dispatch(reason=self.name, request_id=req.id, backend=backend))

    def _gone(self, backend: str) -> None:
        self.state[backend] = "stopped"
        self.placed.pop(backend, None)
        self.draining.discard(backend)

    def _loaded(self) -> list[str]:
        return [b for b, s in self.state.items() if s != "stopped"]

    def _occupying(self, gpu: str) -> list[str]:
        return [b for b, gpus in self.placed.items() if gpu in gpus]

    def _used(self, gpu: str) -> int:
        return sum(self.sizes[b] for b in self._occupying(gpu))

    def _start(self, backend: str, gpus: tuple[str, ...], out: list[Decision]) -> None:
        self.state[backend] = "starting"
        self.placed[backend] = gpus
        out.append(StartBackend(reason=self.name, backend=backend, gpus=gpus))

    def _stop(self, backend: str, why: str, out: list[Decision]) -> None:
        self.state[backend] = "stopping"
        self.draining.discard(backend)
        out.append(StopBackend(reason=f"{self.name}: {why}", backend=backend))

    def _first_gpus(self, backend: str) -> tuple[str, ...]:
        spec = self.specs[backend]
        return spec.gpus[: spec.gpu_count]


def _failed(request_id: str, backend: str, message: str) -> Reject:
    return Reject(
        reason=f"{backend} failed",
        request_id=request_id,
        status=502,
        code="backend_failed",
        message=message,
    )


class LlamaSwap(Baseline):
    """llama-swap's default: one model at a time."""

    name = "llama-swap"

    def _fit(self, backend: str) -> tuple[str, ...] | None:
        return None if self._loaded() else self._first_gpus(backend)

    def _victims(self, backend: str) -> list[str]:
        # Wait for a load in progress to finish before swapping it out again.
        if any(self.state[b] == "starting" for b in self._loaded()):
            return []
        return self._loaded()


class LruBySize(Baseline):
    """Least-recently-used eviction until the declared size fits."""

    name = "lru"
    max_loaded: int | None = None

    def _fit(self, backend: str) -> tuple[str, ...] | None:
        if self.max_loaded is not None and len(self._loaded()) >= self.max_loaded:
            return None
        need = self.sizes[backend]
        for gpu in self.specs[backend].gpus:
            if self.capacity[gpu] - self._used(gpu) >= need:
                return (gpu,)
        return None

    def _order(self, candidates: list[str]) -> list[str]:
        return sorted(candidates, key=lambda b: self.last_used[b])

    def _victims(self, backend: str) -> list[str]:
        need = self.sizes[backend]
        best: tuple[tuple[int, float], list[str]] | None = None
        for gpu in self.specs[backend].gpus:
            ready = [b for b in self._occupying(gpu) if self.state[b] == "ready"]
            free = self.capacity[gpu] - self._used(gpu)
            victims: list[str] = []
            for candidate in self._order(ready):
                if free >= need:
                    break
                victims.append(candidate)
                free += self.sizes[candidate]
            if free < need:
                continue
            cost = (
                sum(self.inflight[v] > 0 or bool(self.queues[v]) for v in victims),
                max((self.last_used[v] for v in victims), default=0.0),
            )
            if best is None or cost < best[0]:
                best = (cost, victims)
        chosen = [] if best is None else best[1]
        if not chosen and self.max_loaded is not None:
            # At the limit of loaded models: one must go, wherever it is.
            ready = [b for b in self._loaded() if self.state[b] == "ready"]
            chosen = self._order(ready)[:1]
        return chosen


class OllamaLike(LruBySize):
    """At most 3 loaded, 5-minute keep-alive, evict the soonest-expiring idle one."""

    name = "ollama"
    max_loaded = 3
    keep_alive_s = 300.0

    def _idle(self, backend: str) -> bool:
        return (
            self.state[backend] == "ready"
            and self.inflight[backend] == 0
            and not self.queues[backend]
            and backend not in self.draining
        )

    def _order(self, candidates: list[str]) -> list[str]:
        # Idle ones first, the soonest-expiring first; busy ones only if needed.
        return sorted(candidates, key=lambda b: (not self._idle(b), self.last_used[b]))

    def _expire(self, now: float, out: list[Decision]) -> None:
        for backend in self.specs:
            if self._idle(backend) and now - self.last_used[backend] >= self.keep_alive_s:
                self._stop(backend, "keep-alive expired", out)

    def next_wakeup(self) -> float | None:
        expiries = [self.last_used[b] + self.keep_alive_s for b in self.specs if self._idle(b)]
        return min(expiries, default=None)


BaselineFactory = Callable[
    [Sequence[DeviceSpec], Sequence[BackendSpec], Mapping[str, int]], Baseline
]

BASELINES: dict[str, BaselineFactory] = {
    "llama-swap": LlamaSwap,
    "lru": LruBySize,
    "ollama": OllamaLike,
}

"""Baseline policies: what yard is compared against, driven by the same engine.

Each has the scheduler's shape (``handle(event, now) -> decisions``,
``next_wakeup()``), so a comparison differs only in the policy. They know each
model's declared size (its resident footprint once loaded, as a user would write it
in a config) and nothing else: no measured peaks, no growth after the first request,
no foreign memory, no deadlines.

- ``llama-swap``: llama-swap's default. First come, first served, head of line: the
  oldest request decides. If its model is not the one loaded, wait for in-flight
  requests to finish, stop everything, start the requested one.
- ``lru``: FIFO loads with least-recently-used eviction by size. Requests for loaded
  models go at once; the oldest request for an unloaded model gets the next load;
  least recently used backends are stopped until it fits (busy ones drain first).
- ``ollama``: Ollama-like. As ``lru``, but at most 3 models loaded, each stopped
  after 5 minutes idle (keep-alive); to make room it evicts the idle backend whose
  keep-alive ends soonest, and waits for a busy one only if none is idle.
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


@dataclass(slots=True)
class _Req:
    id: str
    backend: str
    seq: int
    arrived_at: float


class Baseline:
    """Shared bookkeeping: per-backend FIFO queues, backend states, declared sizes."""

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
        self.queues: dict[str, deque[_Req]] = {b.name: deque() for b in backends}
        self.queued: dict[str, _Req] = {}
        self.running: dict[str, str] = {}
        self.state: dict[str, str] = {b.name: "stopped" for b in backends}
        self.placed: dict[str, tuple[str, ...]] = {}
        self.inflight: dict[str, int] = {b.name: 0 for b in backends}
        self.draining: set[str] = set()
        self.last_used: dict[str, float] = {b.name: 0.0 for b in backends}
        self._seq = 0

    # -- the scheduler's shape ---------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Decision]:
        out: list[Decision] = []
        kind = type(event)
        if kind is RequestArrived:
            assert isinstance(event, RequestArrived)
            self._arrived(event, now, out)
        elif kind is RequestFinished:
            assert isinstance(event, RequestFinished)
            backend = self.running.pop(event.request_id, None)
            if backend is not None:
                self.inflight[backend] -= 1
                self.last_used[backend] = now
                if event.outcome == "upstream_lost":
                    out.append(
                        Reject(
                            reason=f"{backend} failed while serving it",
                            request_id=event.request_id,
                            status=502,
                            code="backend_failed",
                            message=f"backend {backend} failed",
                        )
                    )
        elif kind is RequestCancelled:
            assert isinstance(event, RequestCancelled)
            req = self.queued.pop(event.request_id, None)
            if req is not None:
                self.queues[req.backend].remove(req)
            else:
                backend = self.running.pop(event.request_id, None)
                if backend is not None:
                    self.inflight[backend] -= 1
                    self.last_used[backend] = now
        elif kind is BackendReady:
            assert isinstance(event, BackendReady)
            self.state[event.backend] = "ready"
            self.last_used[event.backend] = now
        elif kind is BackendStartFailed:
            assert isinstance(event, BackendStartFailed)
            self._gone(event.backend)
            queue = self.queues[event.backend]
            while queue:
                req = queue.popleft()
                del self.queued[req.id]
                out.append(
                    Reject(
                        reason=f"{event.backend} failed to start",
                        request_id=req.id,
                        status=502,
                        code="backend_failed",
                        message=event.detail,
                    )
                )
        elif kind is BackendExited or kind is BackendStopped:
            assert isinstance(event, BackendExited | BackendStopped)
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

    # -- helpers ---------------------------------------------------------------------

    def _arrived(self, event: RequestArrived, now: float, out: list[Decision]) -> None:
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
        self._seq += 1
        req = _Req(event.request_id, event.backend, self._seq, now)
        self.queued[req.id] = req
        self.queues[req.backend].append(req)

    def _gone(self, backend: str) -> None:
        self.state[backend] = "stopped"
        self.placed.pop(backend, None)
        self.draining.discard(backend)

    def _occupying(self, gpu: str) -> list[str]:
        return [
            b
            for b, gpus in self.placed.items()
            if gpu in gpus and self.state[b] in ("starting", "ready", "stopping")
        ]

    def _used(self, gpu: str) -> int:
        return sum(self.sizes[b] for b in self._occupying(gpu))

    def _dispatch_ready(self, out: list[Decision]) -> None:
        for backend, queue in self.queues.items():
            if not queue or self.state[backend] != "ready" or backend in self.draining:
                continue
            slots = self.specs[backend].slots
            while queue and self.inflight[backend] < slots:
                self._dispatch(queue.popleft(), out)

    def _dispatch(self, req: _Req, out: list[Decision]) -> None:
        del self.queued[req.id]
        self.running[req.id] = req.backend
        self.inflight[req.backend] += 1
        out.append(Dispatch(reason=self.name, request_id=req.id, backend=req.backend))

    def _start(self, backend: str, gpus: tuple[str, ...], out: list[Decision]) -> None:
        self.state[backend] = "starting"
        self.placed[backend] = gpus
        out.append(StartBackend(reason=self.name, backend=backend, gpus=gpus))

    def _stop(self, backend: str, why: str, out: list[Decision]) -> None:
        self.state[backend] = "stopping"
        self.draining.discard(backend)
        out.append(StopBackend(reason=f"{self.name}: {why}", backend=backend))

    def _oldest(self, pick: Callable[[str], bool]) -> _Req | None:
        best: _Req | None = None
        for backend, queue in self.queues.items():
            if queue and pick(backend) and (best is None or queue[0].seq < best.seq):
                best = queue[0]
        return best

    def schedule(self, now: float) -> list[Decision]:
        raise AssertionError("a baseline defines its schedule")


class LlamaSwap(Baseline):
    """llama-swap's default: one model at a time, strict arrival order."""

    name = "llama-swap"

    def schedule(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        while True:
            head = self._oldest(lambda backend: True)
            if head is None:
                return out
            backend = head.backend
            state = self.state[backend]
            if state == "ready":
                if self.inflight[backend] >= self.specs[backend].slots:
                    return out
                self.queues[backend].popleft()
                self._dispatch(head, out)
                continue
            if state in ("starting", "stopping"):
                return out
            busy = False
            for other, other_state in self.state.items():
                if other == backend or other_state == "stopped":
                    continue
                if other_state == "ready" and self.inflight[other] == 0:
                    self._stop(other, f"swapping to {backend}", out)
                busy = True
            if busy:
                return out
            self._start(backend, self.specs[backend].gpus[: self.specs[backend].gpu_count], out)
            return out


class LruBySize(Baseline):
    """FIFO loads, least-recently-used eviction until the new model fits."""

    name = "lru"
    max_loaded: int | None = None

    def schedule(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        self._dispatch_ready(out)
        for backend in list(self.draining):
            if self.inflight[backend] == 0:
                self._stop(backend, "making room", out)
        if any(s in ("starting", "stopping") for s in self.state.values()) or self.draining:
            return out
        head = self._oldest(lambda backend: self.state[backend] == "stopped")
        if head is None:
            return out
        self._load(head.backend, now, out)
        return out

    def _victim_order(self, candidates: list[str], now: float) -> list[str]:
        return sorted(candidates, key=lambda b: (self.inflight[b] > 0, self.last_used[b]))

    def _load(self, backend: str, now: float, out: list[Decision]) -> None:
        spec = self.specs[backend]
        need = self.sizes[backend]
        loaded = [b for b, s in self.state.items() if s != "stopped"]
        too_many = self.max_loaded is not None and len(loaded) >= self.max_loaded
        if not too_many:
            for gpu in spec.gpus:
                if self.capacity[gpu] - self._used(gpu) >= need:
                    self._start(backend, (gpu,), out)
                    return
        # Choose the GPU whose victims are the least recently used.
        best: tuple[tuple[int, float], list[str]] | None = None
        for gpu in spec.gpus:
            victims: list[str] = []
            free = self.capacity[gpu] - self._used(gpu)
            for candidate in self._victim_order(self._occupying(gpu), now):
                if free >= need:
                    break
                victims.append(candidate)
                free += self.sizes[candidate]
            if free < need:
                continue
            cost = (
                sum(self.inflight[v] > 0 for v in victims),
                max((self.last_used[v] for v in victims), default=0.0),
            )
            if best is None or cost < best[0]:
                best = (cost, victims)
        if best is None:
            return
        chosen = best[1]
        if too_many and not chosen:
            # At the limit of loaded models: one must go, wherever it is.
            chosen = self._victim_order(loaded, now)[:1]
        for victim in chosen:
            if self.inflight[victim] == 0:
                self._stop(victim, f"making room for {backend}", out)
            else:
                self.draining.add(victim)


class OllamaLike(LruBySize):
    """At most 3 loaded, 5-minute keep-alive, evict the soonest-expiring idle one."""

    name = "ollama"
    max_loaded = 3
    keep_alive_s = 300.0

    def schedule(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for backend, state in self.state.items():
            if (
                state == "ready"
                and self.inflight[backend] == 0
                and not self.queues[backend]
                and now - self.last_used[backend] >= self.keep_alive_s
            ):
                self._stop(backend, "keep-alive expired", out)
        out.extend(super().schedule(now))
        return out

    def next_wakeup(self) -> float | None:
        expiries = [
            self.last_used[b] + self.keep_alive_s
            for b, s in self.state.items()
            if s == "ready" and self.inflight[b] == 0 and not self.queues[b]
        ]
        return min(expiries, default=None)


BaselineFactory = Callable[
    [Sequence[DeviceSpec], Sequence[BackendSpec], Mapping[str, int]], Baseline
]

BASELINES: dict[str, BaselineFactory] = {
    "llama-swap": LlamaSwap,
    "lru": LruBySize,
    "ollama": OllamaLike,
}

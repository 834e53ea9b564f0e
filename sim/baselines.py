"""Baseline policies: today's peers, driven by the same engine as yard.

Each follows its peer's current source (snapshots of August 2026; the file is named
in each class) and has the scheduler's shape (``handle(event, now) -> decisions``,
``next_wakeup()``), so a comparison differs only in the policy. They know what a
user of the peer would write down (each model's declared size at its configured
slots, and for llama-swap its measured load time as ``evict_costs``) and what the
peer measures itself (Ollama's sizes after a load, LocalAI's GPU use, the free
memory llama.cpp's ``--fit`` reads): no profiles, no deadlines, no announcements.

- ``llama-swap``: ``internal/router/scheduler/fifo.go`` with the ``matrix`` swapper
  (``internal/router/matrix.go``): queued requests are grouped by model, busy models
  are never stopped, the set of models to stop is the one with the lowest total
  ``evict_costs``, at most ``concurrencyLimit`` (10) requests per model.
- ``ollama``: ``server/sched.go``: one pending request at a time, memory predicted
  before a load, eviction when the prediction passes 80 % of free memory, at most 3
  models per GPU, a 5-minute keep-alive, a queue of 512.
- ``llama.cpp-router``: ``tools/server/server-models.cpp`` (``unload_lru``): at most
  ``--models-max`` (4) models, the least recently used one unloaded when a fifth
  must load, each child started with ``--fit`` (the simulated process fits itself
  to the free memory it finds, :class:`sim.world.SimProcess`).
- ``localai``: ``pkg/model/watchdog.go`` and ``pkg/model/initializers.go``:
  ``--max-active-backends`` with least-recently-used eviction that skips busy
  backends (and waits up to 30 s for them), optionally largest first, and the memory
  reclaimer that evicts the least recently used backend when measured GPU use passes
  80 %.

The slots of each backend are the server's configured ones (``-np`` in llama-swap's
command, the router's preset, ``OLLAMA_NUM_PARALLEL`` set by the station: its default
is 1, which would leave chat's backlog unserved all day). A request handed to a
backend whose slots are busy waits there, as llama-server queues it; it counts as
in flight (the peer cannot stop that backend) and its wait is to its slot.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from yard.core.decisions import Decision, Dispatch, Reject, StartBackend, StopBackend
from yard.core.events import (
    BackendExited,
    BackendReady,
    BackendStartFailed,
    BackendStopped,
    Event,
    MemoryMeasured,
    RequestArrived,
    RequestCancelled,
    RequestFinished,
)
from yard.core.spec import BackendSpec, DeviceSpec, Profile
from yard.core.views import BackendView, DeviceView, QueuedView, Snapshot

MiB = 1 << 20


@dataclass(slots=True, eq=False)
class _Req:
    id: str
    backend: str
    at: float


class Baseline:
    """What every peer keeps: backend states, requests handed to a backend and
    waiting for its slots, what runs, memory readings. Subclasses decide when a
    request is handed over and what is loaded or stopped (:meth:`arrive`,
    :meth:`schedule`)."""

    name = "baseline"
    fits_children = False
    """The peer starts each server so that it fits itself to the free memory it
    finds (llama.cpp's ``--fit``): the runner tells the simulated machine."""

    def __init__(
        self,
        devices: Sequence[DeviceSpec],
        backends: Sequence[BackendSpec],
        sizes: Mapping[str, int],
        load_s: Mapping[str, float] | None = None,
    ) -> None:
        self.devices = {d.name: d for d in devices if d.kind == "gpu"}
        self.total = {d.name: d.total_bytes for d in self.devices.values()}
        self.specs = {b.name: b for b in backends}
        self.sizes = dict(sizes)
        self.load_s = dict(load_s or {})
        self.state: dict[str, str] = {b.name: "stopped" for b in backends}
        self.placed: dict[str, tuple[str, ...]] = {}
        # Handed to the backend: waiting for a slot there (in its process's queue).
        self.held: dict[str, deque[_Req]] = {b.name: deque() for b in backends}
        self.inflight: dict[str, int] = {b.name: 0 for b in backends}
        self.running: dict[str, str] = {}
        self.requests: dict[str, _Req] = {}  # every open request not yet dispatched
        self.last_used: dict[str, float] = {b.name: 0.0 for b in backends}
        self.used: dict[str, int] = dict.fromkeys(self.devices, 0)  # last reading
        self.measured: dict[tuple[str, str], int] = {}  # (backend, gpu): last reading
        self._freed: set[str] = set()  # backends with a slot freed by this event

    # -- the scheduler's shape ---------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Decision]:
        out: list[Decision] = []
        kind = type(event)
        if kind is RequestArrived:
            assert isinstance(event, RequestArrived)
            if self._admissible(event, out):
                req = _Req(event.request_id, event.backend, now)
                self.requests[req.id] = req
                self.arrive(req, now, out)
        elif kind is RequestFinished:
            assert isinstance(event, RequestFinished)
            backend = self.running.pop(event.request_id, None)
            if backend is not None:
                self._done(backend, now)
                if event.outcome == "upstream_lost":
                    out.append(_failed(event.request_id, backend, f"backend {backend} failed"))
        elif kind is RequestCancelled:
            assert isinstance(event, RequestCancelled)
            waiting = self.requests.pop(event.request_id, None)
            if waiting is not None:
                self.forget(waiting)
            else:
                backend = self.running.pop(event.request_id, None)
                if backend is not None:
                    self._done(backend, now)
        elif kind is BackendReady:
            assert isinstance(event, BackendReady)
            self.state[event.backend] = "ready"
            self.last_used[event.backend] = now
            self.ready(event.backend, now, out)
        elif kind is BackendStartFailed or kind is BackendExited:
            assert isinstance(event, BackendStartFailed | BackendExited)
            self._gone(event.backend)
            # What it was handed fails with it (none of the peers retries).
            for req in self.held[event.backend]:
                del self.requests[req.id]
                out.append(_failed(req.id, event.backend, f"backend {event.backend} failed"))
            self.held[event.backend].clear()
            self.gone(event.backend, now, out)
        elif kind is BackendStopped:
            assert isinstance(event, BackendStopped)
            self._gone(event.backend)
            for req in self.held[event.backend]:
                del self.requests[req.id]
                out.append(_failed(req.id, event.backend, f"{event.backend} was unloaded"))
            self.held[event.backend].clear()
            self.gone(event.backend, now, out)
        elif kind is MemoryMeasured:
            assert isinstance(event, MemoryMeasured)
            if event.device in self.used:
                self.used[event.device] = event.used_bytes
                for backend, held in event.backends:
                    self.measured[(backend, event.device)] = held
                self.reading(event.device, now, out)
        for backend in sorted(self._freed):
            self.serve(backend, out)
        self._freed.clear()
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
                queued=len(self.held[name]),
            )
            for name, spec in self.specs.items()
        )
        devices = tuple(
            DeviceView(
                name=d.name,
                kind=d.kind,
                total_bytes=d.total_bytes,
                reserve_bytes=d.reserve_bytes,
                committed_bytes=sum(self.sizes[b] for b in self._on(d.name)),
            )
            for d in self.devices.values()
        )
        return Snapshot(
            now=now, devices=devices, backends=backends, queue=(), queue_length=len(self.requests)
        )

    def explain(self, request_id: str, now: float) -> QueuedView | None:
        return None

    def profile(self, backend: str) -> Profile | None:
        return None

    # -- what a peer decides -------------------------------------------------------------

    def arrive(self, req: _Req, now: float, out: list[Decision]) -> None:
        raise AssertionError("a peer says what happens to a request")

    def schedule(self, now: float) -> list[Decision]:
        return []

    def forget(self, req: _Req) -> None:
        """A request still waiting was cancelled: drop it wherever it waits."""
        held = self.held[req.backend]
        if req in held:
            held.remove(req)

    def ready(self, backend: str, now: float, out: list[Decision]) -> None:
        self.serve(backend, out)

    def gone(self, backend: str, now: float, out: list[Decision]) -> None:
        return None

    def reading(self, device: str, now: float, out: list[Decision]) -> None:
        return None

    def finished(self, backend: str, now: float) -> None:
        return None

    # -- helpers ---------------------------------------------------------------------

    def _admissible(self, event: RequestArrived, out: list[Decision]) -> bool:
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
            return False
        if self.sizes[event.backend] > max(self.total[g] for g in spec.gpus):
            out.append(
                Reject(
                    reason="larger than any GPU",
                    request_id=event.request_id,
                    status=413,
                    code="does_not_fit",
                    message=f"{event.backend} does not fit on any GPU",
                )
            )
            return False
        return True

    def hand(self, req: _Req, out: list[Decision]) -> None:
        """Hand ``req`` to its backend (loading or ready): it waits there for a slot."""
        self.held[req.backend].append(req)
        if self.state[req.backend] == "ready":
            self.serve(req.backend, out)

    def serve(self, backend: str, out: list[Decision]) -> None:
        held = self.held[backend]
        slots = self.specs[backend].slots
        while held and self.inflight[backend] < slots and self.state[backend] == "ready":
            req = held.popleft()
            del self.requests[req.id]
            self.running[req.id] = backend
            self.inflight[backend] += 1
            out.append(Dispatch(reason=self.name, request_id=req.id, backend=backend))

    def busy(self, backend: str) -> bool:
        """It has requests running or handed to it (a peer never stops it then,
        except the llama.cpp router)."""
        return self.inflight[backend] > 0 or bool(self.held[backend])

    def _done(self, backend: str, now: float) -> None:
        self.inflight[backend] -= 1
        self.last_used[backend] = now
        self.finished(backend, now)
        self._freed.add(backend)

    def _gone(self, backend: str) -> None:
        self.state[backend] = "stopped"
        self.placed.pop(backend, None)
        for gpu in self.devices:
            self.measured.pop((backend, gpu), None)

    def loaded(self) -> list[str]:
        return [b for b, s in self.state.items() if s != "stopped"]

    def _on(self, gpu: str) -> list[str]:
        return [b for b, gpus in self.placed.items() if gpu in gpus]

    def start(self, backend: str, gpus: tuple[str, ...], out: list[Decision], why: str) -> None:
        self.state[backend] = "starting"
        self.placed[backend] = gpus
        out.append(StartBackend(reason=f"{self.name}: {why}", backend=backend, gpus=gpus))

    def stop(self, backend: str, out: list[Decision], why: str) -> None:
        self.state[backend] = "stopping"
        out.append(StopBackend(reason=f"{self.name}: {why}", backend=backend))

    def free_by_reading(self, gpu: str) -> int:
        return max(0, self.total[gpu] - self.used[gpu])

    def gpus_for(self, backend: str) -> tuple[str, ...]:
        return self.specs[backend].gpus


def _failed(request_id: str, backend: str, message: str) -> Reject:
    return Reject(
        reason=f"{backend} failed",
        request_id=request_id,
        status=502,
        code="backend_failed",
        message=message,
    )


def _packable(models: Iterable[str], sizes: Mapping[str, int], gpus: Mapping[str, int]) -> bool:
    """The models fit on the GPUs by declared size (first fit, largest first)."""
    free = dict(gpus)
    for model in sorted(models, key=lambda m: (-sizes[m], m)):
        gpu = next((g for g in sorted(free) if free[g] >= sizes[model]), None)
        if gpu is None:
            return False
        free[gpu] -= sizes[model]
    return True


# -- llama-swap ----------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Swap:
    target: str
    evict: tuple[str, ...]
    waiters: list[_Req]


class LlamaSwap(Baseline):
    """llama-swap's router: ``internal/router/scheduler/fifo.go`` (the ``FIFO``
    scheduler, PR #784) with the matrix swapper (``internal/router/matrix.go``,
    ``internal/matrix/program.go``).

    A request for a model that is ready and that the swapper would stop nothing for
    is served at once (the fast path); one for a model being swapped in joins that
    swap. Otherwise it starts a swap: stop the models the swapper names, start its
    own; unless that would stop a model still serving requests, or collide with a
    swap in flight, in which case it is queued. The queue is walked again, in order,
    whenever a swap is done or a model's last request ends: so A B C A B C runs as
    A A B B C C. A model serving requests is never stopped. At most
    ``concurrencyLimit`` requests per model (default 10) are admitted; the next one
    is refused with 429.

    The matrix a careful station writes: every set of models that fit on the GPUs
    together by what each was seen to hold at its most (``sizes`` here are those
    peaks, :attr:`sizes_seen`: written from the declared sizes, the matrix puts
    models together that outgrow them, and the day ends in out-of-memory crashes
    every hour), and ``evict_costs`` from each model's measured load time (whole
    seconds, at least 1): the swapper stops the running models outside the
    compatible set with the lowest total cost. Each model is started on the GPU
    with the most room by declared size (llama-swap itself places nothing: the
    command line does).
    """

    name = "llama-swap"
    concurrency_limit = 10
    sizes_seen = True

    def __init__(
        self,
        devices: Sequence[DeviceSpec],
        backends: Sequence[BackendSpec],
        sizes: Mapping[str, int],
        load_s: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(devices, backends, sizes, load_s)
        self.costs = {b: max(1, round(self.load_s.get(b, 1.0))) for b in self.specs}
        self.reserved: dict[str, int] = dict.fromkeys(self.specs, 0)
        self.active: dict[str, _Swap] = {}
        self.queued: list[_Req] = []
        self.capacity = {g: d.usable_bytes for g, d in self.devices.items()}
        self._solved: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}
        self._drain = False

    # The swapper -------------------------------------------------------------------

    def eviction_for(self, target: str, running: tuple[str, ...]) -> tuple[str, ...]:
        """The running models to stop for ``target``: those outside the compatible
        set with the lowest total evict cost (ties: fewer, then by name)."""
        key = (target, running)
        found = self._solved.get(key)
        if found is not None:
            return found
        others = [m for m in running if m != target]
        best: tuple[tuple[int, int, tuple[str, ...]], tuple[str, ...]] | None = None
        for k in range(len(others) + 1):
            for evict in itertools.combinations(others, k):
                keep = [m for m in others if m not in evict]
                if not _packable([*keep, target], self.sizes, self.capacity):
                    continue
                rank = (sum(self.costs[m] for m in evict), len(evict), evict)
                if best is None or rank < best[0]:
                    best = (rank, evict)
        # A model that fits alone always has a set (everything else stopped).
        result = best[1] if best is not None else tuple(others)
        self._solved[key] = result
        return result

    def running_set(self, exclude: str) -> tuple[str, ...]:
        live = {b for b, s in self.state.items() if s in ("starting", "ready")}
        live |= {t for t in self.active if t != exclude}
        return tuple(sorted(live))

    # The scheduler -----------------------------------------------------------------

    def arrive(self, req: _Req, now: float, out: list[Decision]) -> None:
        if self.reserved[req.backend] >= self.concurrency_limit:
            del self.requests[req.id]
            out.append(
                Reject(
                    reason=f"{self.name}: concurrency limit",
                    request_id=req.id,
                    status=429,
                    code="too_many_requests",
                    message=f"{req.backend}: {self.concurrency_limit} requests already",
                )
            )
            return
        self.reserved[req.backend] += 1
        if not self.decide(req, out):
            self.queued.append(req)

    def decide(self, req: _Req, out: list[Decision]) -> bool:
        """OnRequest's decision tree; False: the request stays queued."""
        model = req.backend
        swap = self.active.get(model)
        if swap is not None:
            swap.waiters.append(req)
            return True
        running = self.running_set(model)
        evict = self.eviction_for(model, running)
        collides = self._collides(model, evict)
        if self.state[model] == "ready" and not evict and not collides:
            self.hand(req, out)
            return True
        if collides or any(self.busy(m) for m in evict):
            return False
        self.active[model] = _Swap(model, evict, [req])
        for victim in evict:
            if self.state[victim] == "ready":
                self.stop(victim, out, f"stopped for {model} (matrix)")
        self._start_if_clear(model, out)
        return True

    def _collides(self, target: str, evict: tuple[str, ...]) -> bool:
        for other, swap in self.active.items():
            if other == target:
                continue
            if other in evict or target in swap.evict or set(evict) & set(swap.evict):
                return True
        return False

    def _start_if_clear(self, model: str, out: list[Decision]) -> None:
        swap = self.active[model]
        if self.state[model] != "stopped":
            if self.state[model] == "ready":
                self._swap_done(model, out)
            return
        if any(self.state[v] != "stopped" for v in swap.evict):
            return
        room = {
            g: self.capacity[g] - sum(self.sizes[b] for b in self._on(g))
            for g in self.gpus_for(model)
        }
        gpu = max(sorted(room), key=lambda g: room[g])
        self.start(model, (gpu,), out, "swap")

    def _swap_done(self, model: str, out: list[Decision]) -> None:
        swap = self.active.pop(model)
        for waiter in swap.waiters:
            self.hand(waiter, out)
        self.drain(out)

    def drain(self, out: list[Decision]) -> None:
        queued, self.queued = self.queued, []
        for req in queued:
            if not self.decide(req, out):
                self.queued.append(req)

    def ready(self, backend: str, now: float, out: list[Decision]) -> None:
        if backend in self.active:
            self._swap_done(backend, out)
        self.serve(backend, out)

    def gone(self, backend: str, now: float, out: list[Decision]) -> None:
        swap = self.active.get(backend)
        if swap is not None and self.state[backend] == "stopped":
            # Its own start failed: the swap's waiters get the error.
            del self.active[backend]
            for waiter in swap.waiters:
                del self.requests[waiter.id]
                self.reserved[waiter.backend] -= 1
                out.append(_failed(waiter.id, backend, f"{backend} failed to start"))
        for target in list(self.active):
            if backend in self.active[target].evict:
                self._start_if_clear(target, out)
        self.drain(out)

    def finished(self, backend: str, now: float) -> None:
        # A reservation ends with its request; when a model's last one ends, swaps
        # queued because they would stop it may go (OnServeDone).
        self.reserved[backend] -= 1
        if not self.busy(backend):
            self._drain = True

    def forget(self, req: _Req) -> None:
        self.reserved[req.backend] -= 1
        if req in self.queued:
            self.queued.remove(req)
            return
        for swap in self.active.values():
            if req in swap.waiters:
                swap.waiters.remove(req)
                return
        super().forget(req)

    def schedule(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        if self._drain:
            self._drain = False
            self.drain(out)
        return out


# -- Ollama --------------------------------------------------------------------------


class Ollama(Baseline):
    """Ollama's scheduler, ``server/sched.go`` (``processPending``,
    ``findRunnerToUnload``, ``updateFreeSpace``).

    Requests are taken one at a time, first come, first served, from a queue of at
    most ``OLLAMA_MAX_QUEUE`` (512; the next is refused with 503). A request whose
    model is loaded is handed to its runner. Otherwise, with
    ``OLLAMA_MAX_LOADED_MODELS`` unset, at most 3 models per GPU are loaded: at the
    limit one runner is unloaded first. Below it the model's memory is predicted (its
    declared size), and free memory is the lesser of what the GPU reports (the last
    reading) and its total minus every loaded runner's size (the real size, recorded
    from the first reading after its load; the prediction until then): a prediction
    above 80 % of free memory unloads one runner first (not with nothing loaded).
    The runner unloaded is the first idle one by keep-alive duration, then by name
    (``ByDurationAndName``: with one keep-alive for all, by name); with none idle,
    the first, once its requests are done. While it waits for an unload, every
    request behind it waits. An idle runner is unloaded after its keep-alive (5
    minutes).
    """

    name = "ollama"
    per_gpu = 3
    max_queue = 512
    keep_alive_s = 300.0
    threshold = 0.8

    def __init__(
        self,
        devices: Sequence[DeviceSpec],
        backends: Sequence[BackendSpec],
        sizes: Mapping[str, int],
        load_s: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(devices, backends, sizes, load_s)
        self.pending: deque[_Req] = deque()
        self.recorded: dict[str, int] = {}
        self.expiring: str | None = None  # the runner unloaded for the head request

    def arrive(self, req: _Req, now: float, out: list[Decision]) -> None:
        if len(self.pending) >= self.max_queue:
            del self.requests[req.id]
            out.append(
                Reject(
                    reason=f"{self.name}: queue full",
                    request_id=req.id,
                    status=503,
                    code="server_busy",
                    message="server busy, please try again. maximum pending requests exceeded",
                )
            )
            return
        self.pending.append(req)

    def forget(self, req: _Req) -> None:
        if req in self.pending:
            self.pending.remove(req)
        else:
            super().forget(req)

    def idle(self, backend: str) -> bool:
        return self.state[backend] == "ready" and not self.busy(backend)

    def reading(self, device: str, now: float, out: list[Decision]) -> None:
        for backend in self._on(device):
            if self.state[backend] == "ready" and backend not in self.recorded:
                held = self.measured.get((backend, device))
                if held:
                    self.recorded[backend] = held

    def gone(self, backend: str, now: float, out: list[Decision]) -> None:
        self.recorded.pop(backend, None)
        if self.expiring == backend:
            self.expiring = None

    def size(self, backend: str) -> int:
        return self.recorded.get(backend, self.sizes[backend])

    def free(self, gpu: str) -> int:
        predicted = self.total[gpu] - sum(self.size(b) for b in self._on(gpu))
        return max(0, min(self.free_by_reading(gpu), predicted))

    def unload_choice(self) -> str | None:
        runners = sorted(b for b in self.loaded() if self.state[b] != "stopping")
        if not runners:
            return None
        for runner in runners:  # one keep-alive for all: by name
            if self.idle(runner):
                return runner
        return runners[0]

    def schedule(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for backend in self.specs:
            if self.idle(backend) and now - self.last_used[backend] >= self.keep_alive_s:
                self.stop(backend, out, "keep-alive expired")
        while self.pending:
            if self.expiring is not None:
                if self.state[self.expiring] == "ready" and not self.busy(self.expiring):
                    self.stop(self.expiring, out, f"making room for {self.pending[0].backend}")
                return out  # wait for the unload, as processPending does
            req = self.pending[0]
            model = req.backend
            if self.state[model] in ("ready", "starting"):
                self.hand(self.pending.popleft(), out)
                continue
            if self.state[model] == "stopping":
                return out
            loaded = self.loaded()
            if len(loaded) >= self.per_gpu * max(1, len(self.devices)):
                self.expiring = self.unload_choice()
                if self.expiring is None:
                    return out
                continue
            gpus = self.gpus_for(model)
            gpu = max(gpus, key=lambda g: (self.free(g), -gpus.index(g)))
            if loaded and self.sizes[model] > self.free(gpu) * self.threshold:
                self.expiring = self.unload_choice()
                if self.expiring is None:
                    return out
                continue
            self.start(model, (gpu,), out, "load")
            self.hand(self.pending.popleft(), out)
        return out

    def next_wakeup(self) -> float | None:
        expiries = [self.last_used[b] + self.keep_alive_s for b in self.specs if self.idle(b)]
        return min(expiries, default=None)


# -- llama.cpp's router ----------------------------------------------------------------


class LlamaCppRouter(Baseline):
    """llama-server in router mode: ``tools/server/server-models.cpp``
    (``server_models::load``, ``unload_lru``), each child started with ``--fit``.

    A request for a model that is loaded or loading goes to its child (which queues
    it for a slot). One for a model not loaded loads it: if ``--models-max`` (4)
    models are active, the least recently used one (by its last request) is
    unloaded first, busy or not (its requests fail), and the load waits until it is
    gone. The router looks at no memory: each child fits itself with ``--fit``,
    shrinking its context to the free memory less 1,024 MiB, down to 4,096 tokens,
    and past that putting layers in host memory (simulated:
    :class:`sim.world.SimProcess`). Each child goes on the GPU with the most free
    memory by the last reading (a real llama-server splits a model over every
    visible GPU).
    """

    name = "llama.cpp-router"
    fits_children = True
    models_max = 4

    def __init__(
        self,
        devices: Sequence[DeviceSpec],
        backends: Sequence[BackendSpec],
        sizes: Mapping[str, int],
        load_s: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(devices, backends, sizes, load_s)
        self.waiting: dict[str, list[_Req]] = {}  # loads waiting for an unload
        self.unloading: dict[str, str] = {}  # victim: the model waiting for it

    def arrive(self, req: _Req, now: float, out: list[Decision]) -> None:
        model = req.backend
        self.last_used[model] = now
        if self.state[model] in ("ready", "starting"):
            self.hand(req, out)
            return
        if model in self.waiting:
            self.waiting[model].append(req)
            return
        self.waiting[model] = [req]
        self._load(model, out)

    def _load(self, model: str, out: list[Decision]) -> None:
        if self.state[model] == "stopping" or model in self.unloading.values():
            return  # tried again once what it waits for is gone
        active = [b for b in self.specs if self.state[b] in ("starting", "ready")]
        if len(active) >= self.models_max:
            ready = [b for b in active if self.state[b] == "ready"]
            if not ready:
                return  # tried again when one is ready
            victim = min(ready, key=lambda b: (self.last_used[b], b))
            self.unloading[victim] = model
            self.stop(
                victim, out, f"models-max {self.models_max}: unloading the least recently used"
            )
            return
        gpus = self.gpus_for(model)
        gpu = max(
            gpus, key=lambda g: (self.free_by_reading(g) - self._starting_on(g), -gpus.index(g))
        )
        self.start(model, (gpu,), out, "load (--fit)")
        for req in self.waiting.pop(model):
            self.hand(req, out)

    def _starting_on(self, gpu: str) -> int:
        # Loads not yet in a reading take their declared size.
        return sum(
            self.sizes[b]
            for b in self._on(gpu)
            if self.state[b] == "starting" and not self.measured.get((b, gpu))
        )

    def forget(self, req: _Req) -> None:
        waiters = self.waiting.get(req.backend)
        if waiters is not None and req in waiters:
            waiters.remove(req)
        else:
            super().forget(req)

    def gone(self, backend: str, now: float, out: list[Decision]) -> None:
        self.unloading.pop(backend, None)
        self._retry(out)

    def ready(self, backend: str, now: float, out: list[Decision]) -> None:
        self.serve(backend, out)
        self._retry(out)

    def _retry(self, out: list[Decision]) -> None:
        for model in sorted(self.waiting, key=lambda m: (self.waiting[m][0].at, m)):
            if self.waiting.get(model):
                self._load(model, out)


# -- LocalAI ---------------------------------------------------------------------------


class LocalAI(Baseline):
    """LocalAI's model loader and watchdog: ``pkg/model/initializers.go``
    (``enforceLRULimit``, ``retryEnforce``) and ``pkg/model/watchdog.go``
    (``EnforceLRULimit``, ``checkMemory``, ``evictLRUModel``).

    A request for a loaded model goes to its backend. One for a model not loaded
    first makes room under ``--max-active-backends``: it evicts the least recently
    used backends (largest first with ``largest_first``), skipping busy ones; if a
    busy one is in the way it tries again every second, 30 times, then loads anyway.
    Loads look at no memory. The memory reclaimer (threshold 80 %) evicts the least
    recently used idle backend whenever measured GPU use passes the threshold
    (LocalAI polls every 500 ms; here at each meter reading).

    ``--max-active-backends`` is what a careful station sets: the most backends that
    fit together whatever they are (the largest declared sizes first, per GPU).
    """

    name = "localai"
    threshold = 0.8
    retries = 30
    retry_s = 1.0
    largest_first = False

    def __init__(
        self,
        devices: Sequence[DeviceSpec],
        backends: Sequence[BackendSpec],
        sizes: Mapping[str, int],
        load_s: Mapping[str, float] | None = None,
        max_active: int | None = None,
    ) -> None:
        super().__init__(devices, backends, sizes, load_s)
        self.max_active = max_active if max_active is not None else self._careful_limit()
        self.waiting: dict[str, list[_Req]] = {}
        self.tries: dict[str, int] = {}
        self.retry_at: dict[str, float] = {}

    def _careful_limit(self) -> int:
        largest = sorted(self.sizes.values(), reverse=True)
        room = {g: d.usable_bytes for g, d in self.devices.items()}
        count = 0
        for size in largest:
            gpu = max(sorted(room), key=lambda g: room[g])
            if room[gpu] < size:
                break
            room[gpu] -= size
            count += 1
        return max(1, count)

    def order(self, candidates: Iterable[str]) -> list[str]:
        if self.largest_first:
            return sorted(candidates, key=lambda b: (-self.sizes[b], self.last_used[b], b))
        return sorted(candidates, key=lambda b: (self.last_used[b], b))

    def arrive(self, req: _Req, now: float, out: list[Decision]) -> None:
        model = req.backend
        self.last_used[model] = now
        if self.state[model] in ("ready", "starting"):
            self.hand(req, out)
            return
        if model in self.waiting:
            self.waiting[model].append(req)
            return
        self.waiting[model] = [req]
        self.tries[model] = 0
        self._try_load(model, now, out)

    def _try_load(self, model: str, now: float, out: list[Decision]) -> None:
        if self.state[model] == "stopping":
            self.retry_at[model] = now + self.retry_s
            return
        # Loaded ones plus loads under way plus this one, within the limit.
        active = [b for b in self.specs if self.state[b] in ("starting", "ready")]
        need = len(active) + 1 - self.max_active
        evicted = 0
        skipped = 0
        if need > 0:
            for candidate in self.order(b for b in active if self.state[b] == "ready"):
                if evicted >= need:
                    break
                if self.busy(candidate):
                    skipped += 1
                    continue
                self.stop(candidate, out, f"max-active-backends {self.max_active} (LRU)")
                evicted += 1
        if evicted < need and skipped and self.tries[model] < self.retries - 1:
            self.tries[model] += 1
            self.retry_at[model] = now + self.retry_s
            return
        self.retry_at.pop(model, None)
        gpus = self.gpus_for(model)
        gpu = max(gpus, key=lambda g: (self.free_by_reading(g), -gpus.index(g)))
        self.start(model, (gpu,), out, "load")
        for req in self.waiting.pop(model):
            self.hand(req, out)

    def forget(self, req: _Req) -> None:
        waiters = self.waiting.get(req.backend)
        if waiters is not None and req in waiters:
            waiters.remove(req)
        else:
            super().forget(req)

    def reading(self, device: str, now: float, out: list[Decision]) -> None:
        if self.used[device] <= self.threshold * self.total[device]:
            return
        for candidate in self.order(b for b in self._on(device) if self.state[b] == "ready"):
            if not self.busy(candidate):
                self.stop(candidate, out, f"memory reclaimer: GPU use over {self.threshold:.0%}")
                return

    def schedule(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for model, at in sorted(self.retry_at.items(), key=lambda item: (item[1], item[0])):
            if at <= now and model in self.waiting:
                self._try_load(model, now, out)
        return out

    def next_wakeup(self) -> float | None:
        return min(self.retry_at.values(), default=None)


BaselineFactory = Callable[
    [Sequence[DeviceSpec], Sequence[BackendSpec], Mapping[str, int], Mapping[str, float]],
    Baseline,
]

BASELINES: dict[str, BaselineFactory] = {
    "llama-swap": LlamaSwap,
    "ollama": Ollama,
    "llama.cpp-router": LlamaCppRouter,
    "localai": LocalAI,
}

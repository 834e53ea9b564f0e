"""The simulated machine: devices with a real capacity and backends that load, serve,
grow and crash on virtual time.

Rules this module keeps:

- Memory is physical here. Every allocation of a simulated process is checked against
  the device's capacity at that moment (its own use, every other process's, foreign
  use); one that does not fit kills the allocating process with ``oom=True``, as CUDA
  or the kernel would. The sim never asks the policy whether it over-committed: it
  finds out.
- Slots are physical too. A process serves at most the slots it was launched with
  (a request handed to a full one waits inside it, as llama-server queues it, and is
  counted in ``SimWorld.queued_in_process``); each slot beyond the first holds its
  KV cache from the load (``ModelSpec.slot_bytes``); where a model shares its speed
  (``ModelSpec.speedup``), ``k`` requests served at once each run at
  ``speedup[k-1] / k`` of their speed alone.
- The only randomness is the simulator's ``random.Random`` passed in (load-time
  jitter); the only clock is Trio's (a ``MockClock`` in every simulation).
- The world implements the ports (:class:`~yard.ports.Launcher`,
  :class:`~yard.ports.BackendProcess`, :class:`~yard.ports.Meter`,
  :class:`~yard.ports.ProfileStore`), so the engine drives it exactly as it drives
  real processes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import trio

from yard.core.spec import HOST, BackendSpec, DeviceSpec, Profile, instance_name
from yard.ports import BackendStartError, DeviceReading, ExitStatus

GiB = 1 << 30
MiB = 1 << 20

SLOTS_INDEPENDENT = None
"""A model's ``speedup`` where each slot runs at full speed whatever the others do
(every scenario before slot ranges: chat's four slots, TTS's two)."""

FIT_MARGIN = 1024 * MiB
"""What llama.cpp's ``--fit`` leaves free on each device (``--fit-target``'s default)."""

FIT_MIN_CONTEXT = 4096
"""The smallest context ``--fit`` shrinks to (``--fit-ctx``'s default)."""

HOST_TO_GPU_SPEED = 12.5
"""How much slower a layer runs from host memory than from the GPU's: decoding
reads every weight once a token, so the ratio of memory bandwidths (about 1 TB/s
on a 24 GiB card against 80 GB/s of dual-channel DDR5)."""

LLAMA_CPP_SPEEDUP = (1.0, 1.2, 1.5, 1.8)
"""Aggregate decode throughput of llama.cpp serving k = 1..4 sequences at once,
relative to one: llama.cpp's own ``batched-bench`` sample (LLaMA 7B F16, 128 prompt
+ 128 generated tokens per sequence, ``examples/batched-bench/README.md``):
41.6, 50.9 and 74.4 tokens/s at 1, 2 and 4 sequences (1.22x, 1.79x), rounded down,
with 3 between. Conservative: quantized weights on recent CUDA kernels gain more
(decoding is bound by reading the weights, which every sequence of a batch shares)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """One simulated backend and how its process behaves.

    gpu_bytes: resident on each GPU it occupies once loaded (the "declared" size a
        user would write down, and what baselines are told).
    host_bytes: resident host memory once loaded.
    load_s: mean time from launch to ready (warm-up included); each load varies
        uniformly by ``load_jitter`` (a fraction) around it.
    warmup_extra_bytes: held on each GPU during the second half of loading (the
        warm-up request exercising the longest context), then released.
    growth_bytes: allocated on each GPU when the first request is served (caches,
        fragmentation), and kept.
    slots: how many requests one process serves at once (llama-server's ``-np``);
        a request handed to a process whose slots are all busy waits inside it,
        first come first served, as llama-server queues its tasks.
    instances, instance_of, spread_windows: as :class:`~yard.core.spec.BackendSpec`'s; a scenario
        lists every instance (:func:`with_instances`), each a process of its own.
    parallel: a slot range (min, max) yard chooses the slot count in at each start
        (``parallel = { min, max }``; ``slots`` is then only yard's estimate before
        a start). A process launched without a count runs the maximum: what a
        configured fixed ``-np`` gives (:meth:`fixed`).
    slot_bytes: what each slot beyond the first adds on each GPU (its KV cache,
        allocated at load); ``gpu_bytes`` is the size at one slot.
    kv_bytes, context_tokens: the KV cache inside ``gpu_bytes_at(slots)`` (every
        slot's) and the context it is sized for (tokens over all slots): what
        llama.cpp's ``--fit`` may shrink, down to :data:`FIT_MIN_CONTEXT` tokens
        (0: nothing to shrink). Only a process launched on a world with
        ``fit_margin`` uses them.
    speedup: the aggregate throughput of ``k`` requests served at once, relative to
        one alone, for k = 1, 2, ... (the last entry holds beyond): each of the
        ``k`` runs at ``speedup[k-1] / k`` of its speed alone, recomputed whenever
        one starts or ends (processor sharing; ``service_s`` is the time alone).
        None: every slot runs at full speed, independently (:data:`SLOTS_INDEPENDENT`).
    """

    name: str
    gpu_bytes: int
    load_s: float
    host_bytes: int = 1 * GiB
    load_jitter: float = 0.1
    warmup_extra_bytes: int = 0
    growth_bytes: int = 0
    slots: int = 1
    gpus: tuple[str, ...] = ("gpu0",)
    gpu_count: int = 1
    idle_ttl_s: float | None = None
    pinned: bool = False
    instances: int = 1
    instance_of: str | None = None
    spread_windows: bool = False
    parallel: tuple[int, int] | None = None
    slot_bytes: int = 0
    speedup: tuple[float, ...] | None = SLOTS_INDEPENDENT
    kv_bytes: int = 0
    context_tokens: int = 0

    def __post_init__(self) -> None:
        if self.speedup is not None and (
            not self.speedup or self.speedup[0] != 1.0 or min(self.speedup) <= 0
        ):
            raise ValueError(f"{self.name}: speedup starts at 1.0 (one request alone), all > 0")

    def backend_spec(self) -> BackendSpec:
        return BackendSpec(
            name=self.name,
            gpus=self.gpus,
            gpu_count=self.gpu_count,
            slots=self.slots,
            idle_ttl_s=self.idle_ttl_s,
            pinned=self.pinned,
            instances=self.instances,
            instance_of=self.instance_of,
            spread_windows=self.spread_windows,
            parallel=self.parallel,
        )

    def slots_at(self, parallel: int | None) -> int:
        """The slots a process launched with ``parallel`` runs (None: no count was
        given: the range's maximum, else ``slots``)."""
        if parallel is not None:
            return parallel
        return self.parallel[1] if self.parallel is not None else self.slots

    def gpu_bytes_at(self, slots: int) -> int:
        """Resident on each GPU once loaded, with ``slots`` slots."""
        return self.gpu_bytes + self.slot_bytes * (slots - 1)

    @property
    def base_slots(self) -> int:
        """The slot count its stored profile is measured at: the range's minimum,
        else ``slots``."""
        return self.parallel[0] if self.parallel is not None else self.slots

    @property
    def peak_gpu_bytes(self) -> int:
        """The most it ever holds on one GPU (after growth or during warm-up), at
        :attr:`base_slots`."""
        return self.gpu_bytes_at(self.base_slots) + max(self.warmup_extra_bytes, self.growth_bytes)

    @property
    def declared_bytes(self) -> int:
        """The size a user would write down for the process a fixed configuration
        runs (:meth:`slots_at` None): what the baselines are told."""
        return self.gpu_bytes_at(self.slots_at(None))

    def fixed(self) -> ModelSpec:
        """The same server configured with a fixed slot count (the range's maximum),
        as llama-swap's command, Ollama's ``OLLAMA_NUM_PARALLEL`` or any fixed
        configuration would run it."""
        if self.parallel is None:
            return self
        return replace(self, parallel=None, slots=self.parallel[1])

    def speed(self, k: int) -> float:
        """The fraction of its speed alone each of ``k`` concurrent requests runs at."""
        if self.speedup is None or k <= 1:
            return 1.0
        return self.speedup[min(k, len(self.speedup)) - 1] / k


def with_instances(model: ModelSpec, count: int) -> tuple[ModelSpec, ...]:
    """``model`` as ``count`` instances (``NAME``, ``NAME@2``, ...), as the
    configuration expands ``instances = count``: the same server, each instance a
    process of its own with the same size, load time and slots."""
    first = replace(model, instances=count, instance_of=None)
    return (
        first,
        *(
            replace(first, name=instance_name(model.name, k), instance_of=model.name)
            for k in range(2, count + 1)
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineSpec:
    """GPUs (name, capacity) and host RAM. ``reserve_bytes`` is what yard is told
    to keep free on each GPU."""

    gpus: tuple[tuple[str, int], ...]
    host_bytes: int = 64 * GiB
    reserve_bytes: int = 256 * MiB
    host_reserve_bytes: int = 2 * GiB

    def device_specs(self) -> list[DeviceSpec]:
        specs = [
            DeviceSpec(name=name, kind="gpu", total_bytes=total, reserve_bytes=self.reserve_bytes)
            for name, total in self.gpus
        ]
        specs.append(
            DeviceSpec(
                name=HOST,
                kind="host",
                total_bytes=self.host_bytes,
                reserve_bytes=self.host_reserve_bytes,
            )
        )
        return specs


# -- faults --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashWhileLoading:
    """The ``load``-th launch of ``backend`` (1-based) crashes halfway through loading."""

    backend: str
    load: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class HangOnLoad:
    """The ``load``-th launch of ``backend`` never becomes ready."""

    backend: str
    load: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowStart:
    """The ``load``-th launch of ``backend`` takes ``factor`` times as long."""

    backend: str
    load: int = 1
    factor: float = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashWhileServing:
    """From ``at`` on, the first time ``backend`` is serving a request (checked every
    second), its process dies of a segfault."""

    backend: str
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ForeignMemory:
    """At ``at``, a process yard does not own takes ``bytes`` on ``device`` (as much
    of it as is free), until ``until`` (None: for good)."""

    device: str
    at: float
    bytes: int
    until: float | None = None


Fault = CrashWhileLoading | HangOnLoad | SlowStart | CrashWhileServing | ForeignMemory


@dataclass(frozen=True, slots=True, kw_only=True)
class OomKill:
    """One out-of-memory death in the world, for the report."""

    at: float
    backend: str
    device: str
    phase: str  # "loading", "serving" (growth on first request)
    foreign_bytes: int


# -- accounting ------------------------------------------------------------------------


class Ledger:
    """Where each GPU's time went: loading, serving, idle while work waited, idle.

    Priority of states: a GPU with a load in progress counts as loading; else with a
    request running, serving; else, if a request waits for a backend that may use
    it, idle while work waited.
    """

    def __init__(self, gpus: Sequence[str], backend_gpus: Mapping[str, tuple[str, ...]]) -> None:
        self.gpus = tuple(gpus)
        self.backend_gpus = dict(backend_gpus)
        self.loading = dict.fromkeys(self.gpus, 0)
        self.serving = dict.fromkeys(self.gpus, 0)
        self.waiting = dict.fromkeys(self.gpus, 0)
        self.seconds = {
            g: {"loading": 0.0, "serving": 0.0, "idle_with_work": 0.0, "idle": 0.0}
            for g in self.gpus
        }
        self._last = 0.0

    def _account(self) -> None:
        now = trio.current_time()
        dt = now - self._last
        if dt <= 0:
            return
        self._last = now
        for gpu in self.gpus:
            if self.loading[gpu]:
                state = "loading"
            elif self.serving[gpu]:
                state = "serving"
            elif self.waiting[gpu]:
                state = "idle_with_work"
            else:
                state = "idle"
            self.seconds[gpu][state] += dt

    def load(self, gpus: tuple[str, ...], delta: int) -> None:
        self._account()
        for gpu in gpus:
            self.loading[gpu] += delta

    def serve(self, gpus: tuple[str, ...], delta: int) -> None:
        self._account()
        for gpu in gpus:
            self.serving[gpu] += delta

    def wait(self, backend: str, delta: int) -> None:
        self._account()
        for gpu in self.backend_gpus.get(backend, ()):
            self.waiting[gpu] += delta

    def close(self) -> None:
        self._account()


# -- devices and processes -------------------------------------------------------------


class SimDevice:
    """One memory pool with a hard capacity."""

    __slots__ = ("capacity", "foreign", "name", "used")

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.used = 0
        self.foreign = 0


class SimProcess:
    """One simulated backend process (implements :class:`~yard.ports.BackendProcess`)."""

    def __init__(
        self,
        world: SimWorld,
        model: ModelSpec,
        gpus: tuple[str, ...],
        serial: int,
        slots: int | None = None,
    ):
        self._world = world
        self.model = model
        self.gpus = gpus
        self.serial = serial
        self.slots = model.slots if slots is None else slots
        # What ``--fit`` took off its footprint on each GPU, and how much slower it
        # serves for the layers it put in host memory (1.0: none).
        self.shrunk = 0
        self.slowdown = 1.0
        self.state = "loading"
        self.usage: dict[str, int] = {}
        self.active = 0
        self.most_active = 0  # the most requests it ever served at once
        self.served = 0
        self.stopping = False
        # Requests handed to it while every slot was busy, first come first served.
        self.waiting: list[object] = []
        self._slot_freed = trio.Event()
        # Processor sharing (``model.speedup``): each running request's work left,
        # in seconds at its speed alone, as of ``_shared_at``.
        self._left: dict[object, float] = {}
        self._shared_at = 0.0
        self._shared_changed = trio.Event()
        self._settled = trio.Event()
        self._dead = trio.Event()
        self._status = ExitStatus(code=None)
        self._base_url = f"sim://{model.name}/{serial}"

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def pid(self) -> int | None:
        return None

    @property
    def alive(self) -> bool:
        return self.state != "dead"

    async def wait_ready(self) -> None:
        await self._settled.wait()
        if self.state == "dead":
            raise BackendStartError(self._status.detail, oom=self._status.oom)

    async def wait_exit(self) -> ExitStatus:
        await self._dead.wait()
        return self._status

    async def stop(self) -> ExitStatus:
        if self.state != "dead":
            self.stopping = True
            await trio.sleep(self._world.stop_s)
            self.die(ExitStatus(code=-15, detail="stopped"))
        else:
            await trio.lowlevel.checkpoint()
        return self._status

    def log_lines(self) -> list[str]:
        return [f"{self.name}#{self.serial}: {self.state}", self._status.detail]

    # -- driven by the world ---------------------------------------------------------

    def die(self, status: ExitStatus) -> None:
        if self.state == "dead":
            return
        world = self._world
        if self.state == "loading":
            world.ledger.load(self.gpus, -1)
        self.state = "dead"
        self._status = status
        for device, used in self.usage.items():
            world.devices[device].used -= used
        self.usage.clear()
        if world.running.get(self.name) is self:
            del world.running[self.name]
        self._settled.set()
        self._dead.set()
        self._slot_freed.set()
        self._shared_changed.set()

    def allocate(self, device: str, amount: int, phase: str) -> bool:
        """Take ``amount`` more bytes on ``device``; die of OOM if it does not fit."""
        if self.state == "dead":
            return False
        dev = self._world.devices[device]
        if dev.used + dev.foreign + amount > dev.capacity:
            self._world.ooms.append(
                OomKill(
                    at=trio.current_time(),
                    backend=self.name,
                    device=device,
                    phase=phase,
                    foreign_bytes=dev.foreign,
                )
            )
            self.die(ExitStatus(code=-9, oom=True, detail=f"{device}: out of memory ({phase})"))
            return False
        dev.used += amount
        self.usage[device] = self.usage.get(device, 0) + amount
        return True

    def release(self, device: str, amount: int) -> None:
        if self.state == "dead":
            return
        amount = min(amount, self.usage.get(device, 0))
        self._world.devices[device].used -= amount
        self.usage[device] -= amount

    # -- serving ---------------------------------------------------------------------

    async def wait_for_slot(self) -> bool:
        """Wait, behind earlier ones, until a slot is free (False: it died meanwhile)."""
        self._world.queued_in_process += 1
        me = object()
        self.waiting.append(me)
        try:
            while self.state != "dead" and (self.waiting[0] is not me or self.active >= self.slots):
                await self._slot_freed.wait()
        finally:
            self.waiting.remove(me)
            self.free_slot()
        return self.state != "dead"

    def free_slot(self) -> None:
        """Wake the requests waiting for a slot (the first of them takes it)."""
        self._slot_freed.set()
        self._slot_freed = trio.Event()

    def _share_until_now(self) -> None:
        """Take the work done since ``_shared_at`` off every running request."""
        now = trio.current_time()
        if self._left:
            done = (now - self._shared_at) * self.model.speed(len(self._left))
            for key in self._left:
                self._left[key] -= done
        self._shared_at = now

    def _shared_change(self) -> None:
        self._shared_changed.set()
        self._shared_changed = trio.Event()

    async def share(self, service_s: float) -> None:
        """Serve ``service_s`` seconds of work (its time alone) at the speed the
        requests running beside it leave it, until done or the process dies."""
        me = object()
        self._share_until_now()
        self._left[me] = service_s
        self._shared_change()
        try:
            while self.state != "dead":
                left = self._left[me]
                if left <= 1e-9 * max(1.0, service_s):
                    break
                changed = self._shared_changed
                ends = self._shared_at + left / self.model.speed(len(self._left))
                with trio.move_on_at(ends):
                    await changed.wait()
                self._share_until_now()
        finally:
            self._share_until_now()
            del self._left[me]
            self._shared_change()

    def fit(self, margin: int) -> None:
        """What llama.cpp's ``--fit`` does at start-up: project the footprint
        (resident at its slots plus the warm-up's buffers) against the free memory
        of its fullest GPU less ``margin``; where it does not fit, shrink the KV
        cache (the context) down to :data:`FIT_MIN_CONTEXT` tokens, then put as
        many weights as needed in host memory, which slows every request by the
        share of weights there times :data:`HOST_TO_GPU_SPEED`."""
        model = self.model
        resident = model.gpu_bytes_at(self.slots)
        free = min(
            self._world.devices[g].capacity
            - self._world.devices[g].used
            - self._world.devices[g].foreign
            for g in self.gpus
        )
        over = resident + model.warmup_extra_bytes - (free - margin)
        if over <= 0:
            return
        kv = model.kv_bytes + model.slot_bytes * (self.slots - 1) if model.kv_bytes else 0
        if kv and model.context_tokens > FIT_MIN_CONTEXT:
            least = kv * FIT_MIN_CONTEXT // model.context_tokens
            cut = min(over, kv - least)
        else:
            cut = 0
        weights = resident - kv
        spill = min(max(0, over - cut), weights)
        self.shrunk = cut + spill
        if spill:
            self.slowdown = 1.0 + (HOST_TO_GPU_SPEED - 1.0) * spill / weights

    async def life(self, load_s: float, crash: bool, hang: bool) -> None:
        """Load: host memory and half the weights at once, the rest halfway, the
        warm-up's extra during the second half; then ready."""
        model = self.model
        if not self.allocate(HOST, model.host_bytes, "loading"):
            return
        half = model.gpu_bytes // 2
        # The slots beyond the first (their KV cache) are allocated at start.
        extra = model.gpu_bytes_at(self.slots) - model.gpu_bytes
        if self._world.fit_margin is not None:
            self.fit(self._world.fit_margin)
        first = half + extra - min(self.shrunk, half + extra)
        for gpu in self.gpus:
            if not self.allocate(gpu, first, "loading"):
                return
        await trio.sleep(load_s / 2)
        if self.state == "dead":
            return
        if crash:
            self.die(ExitStatus(code=1, detail="crashed while loading the model"))
            return
        second = model.gpu_bytes - half - max(0, self.shrunk - half - extra)
        for gpu in self.gpus:
            if not self.allocate(gpu, second + model.warmup_extra_bytes, "loading"):
                return
        if hang:
            await self._dead.wait()
            return
        await trio.sleep(load_s / 2)
        if self.state == "dead":
            return
        for gpu in self.gpus:
            self.release(gpu, model.warmup_extra_bytes)
        self.state = "ready"
        self._world.ledger.load(self.gpus, -1)
        self._settled.set()


class SimWorld:
    """The machine, its processes and the faults scheduled against it.

    It is the launcher, the meter and the profile store of a simulation run; ``serve``
    plays the upstream call a request makes once dispatched.
    """

    def __init__(
        self,
        machine: MachineSpec,
        models: Sequence[ModelSpec],
        rng: random.Random,
        *,
        faults: Sequence[Fault] = (),
        stored_profiles: Mapping[str, Profile] | None = None,
        stop_s: float = 1.0,
        fit_margin: int | None = None,
    ) -> None:
        """fit_margin: every process fits itself to the free memory it finds at its
        start, leaving this much (llama.cpp's ``--fit``, :meth:`SimProcess.fit`);
        None: each takes its full size."""
        self.machine = machine
        self.fit_margin = fit_margin
        self.models = {m.name: m for m in models}
        self.rng = rng
        self.faults = tuple(faults)
        self.stop_s = stop_s
        self.devices = {name: SimDevice(name, total) for name, total in machine.gpus}
        self.devices[HOST] = SimDevice(HOST, machine.host_bytes)
        self.profiles: dict[str, Profile] = dict(stored_profiles or {})
        self.profile_puts: list[tuple[float, str, Profile]] = []
        self.running: dict[str, SimProcess] = {}
        self.by_url: dict[str, SimProcess] = {}
        self.launches: list[tuple[float, str, tuple[str, ...]]] = []
        self.launch_slots: list[int] = []  # the slots of each launch, beside ``launches``
        self.load_counts: dict[str, int] = {}
        self.ooms: list[OomKill] = []
        self.fault_log: list[str] = []
        # Requests that found every slot of their process busy and waited inside it
        # (a policy never does that on purpose: its dispatch counts the slots).
        self.queued_in_process = 0
        self.ledger = Ledger([name for name, _ in machine.gpus], {m.name: m.gpus for m in models})
        self._nursery: trio.Nursery | None = None
        self._serial = 0
        # The latest process of each backend, dead or alive (its log).
        self._last: dict[str, SimProcess] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the processes' lives and the timed faults until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for fault in self.faults:
                if isinstance(fault, CrashWhileServing | ForeignMemory):
                    nursery.start_soon(self._timed_fault, fault)
            task_status.started()
            await trio.sleep_forever()

    # -- Launcher ----------------------------------------------------------------------

    def backend_log(self, backend: str) -> list[str]:
        """What the backend's last simulated process says (BackendLogs)."""
        process = self._last.get(backend)
        return process.log_lines() if process is not None else []

    async def launch(
        self,
        backend: str,
        gpus: tuple[str, ...],
        *,
        measure: bool = False,
        context: int | None = None,
        parallel: int | None = None,
    ) -> SimProcess:
        await trio.lowlevel.checkpoint()
        model = self.models.get(backend)
        if model is None:
            raise BackendStartError(f"{backend}: no such backend in this simulation")
        assert self._nursery is not None, "the world must be running"
        count = self.load_counts.get(backend, 0) + 1
        self.load_counts[backend] = count
        crash = hang = False
        factor = 1.0
        for fault in self.faults:
            if getattr(fault, "backend", None) != backend or getattr(fault, "load", 0) != count:
                continue
            if isinstance(fault, CrashWhileLoading):
                crash = True
            elif isinstance(fault, HangOnLoad):
                hang = True
            elif isinstance(fault, SlowStart):
                factor *= fault.factor
            self.fault_log.append(f"{trio.current_time():.3f} {fault!r}")
        jitter = model.load_jitter * (2 * self.rng.random() - 1)
        load_s = model.load_s * (1 + jitter) * factor
        self._serial += 1
        process = SimProcess(self, model, gpus, self._serial, model.slots_at(parallel))
        self.launches.append((trio.current_time(), backend, gpus))
        self.launch_slots.append(process.slots)
        self.running[backend] = process
        self._last[backend] = process
        self.by_url[process.base_url] = process
        self.ledger.load(gpus, +1)
        self._nursery.start_soon(process.life, load_s, crash, hang)
        return process

    # -- Meter -------------------------------------------------------------------------

    def device_totals(self) -> Mapping[str, int]:
        return {name: dev.capacity for name, dev in self.devices.items()}

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        await trio.lowlevel.checkpoint()
        return self.readings()

    def readings(self) -> list[DeviceReading]:
        readings = []
        for name, dev in self.devices.items():
            backends = {
                p.name: p.usage[name] for p in self.running.values() if p.usage.get(name, 0) > 0
            }
            readings.append(
                DeviceReading(
                    device=name,
                    total_bytes=dev.capacity,
                    used_bytes=dev.used + dev.foreign,
                    backends=backends,
                )
            )
        return readings

    # -- ProfileStore --------------------------------------------------------------------

    async def get(self, backend: str) -> Profile | None:
        await trio.lowlevel.checkpoint()
        return self.profiles.get(backend)

    async def put(self, backend: str, profile: Profile) -> None:
        await trio.lowlevel.checkpoint()
        self.profiles[backend] = profile
        self.profile_puts.append((trio.current_time(), backend, profile))

    async def forget(self, backend: str) -> None:
        await trio.lowlevel.checkpoint()
        self.profiles.pop(backend, None)

    # -- the upstream call ------------------------------------------------------------

    def ready(self, backend: str) -> bool:
        process = self.running.get(backend)
        return process is not None and process.state == "ready" and not process.stopping

    async def serve(self, base_url: str, service_s: float) -> bool:
        """Serve one request on the process at ``base_url`` for ``service_s``.
        Returns False if the process was gone or died meanwhile (the upstream
        connection broke)."""
        process = self.by_url.get(base_url)
        if process is None or process.state != "ready":
            await trio.lowlevel.checkpoint()
            return False
        if process.served == 0 and process.model.growth_bytes:
            for gpu in process.gpus:
                if not process.allocate(gpu, process.model.growth_bytes, "serving"):
                    await trio.lowlevel.checkpoint()
                    return False
        full = process.active >= process.slots or bool(process.waiting)
        if full and not await process.wait_for_slot():
            return False
        process.served += 1
        process.active += 1
        process.most_active = max(process.most_active, process.active)
        self.ledger.serve(process.gpus, +1)
        try:
            service_s *= process.slowdown
            if process.model.speedup is None:
                with trio.move_on_after(service_s):
                    await process._dead.wait()
            else:
                await process.share(service_s)
        finally:
            # Also when the client gives up meanwhile: the server stops its work.
            process.active -= 1
            self.ledger.serve(process.gpus, -1)
            if process.waiting:
                process.free_slot()
        return process.state != "dead"

    # -- faults ------------------------------------------------------------------------

    async def _timed_fault(self, fault: CrashWhileServing | ForeignMemory) -> None:
        await trio.sleep_until(fault.at)
        if isinstance(fault, CrashWhileServing):
            # From ``at`` on, the first moment the backend is serving a request.
            while True:
                process = self.running.get(fault.backend)
                if process is not None and process.state == "ready" and process.active > 0:
                    break
                await trio.sleep(1.0)
            self.fault_log.append(f"{trio.current_time():.3f} {fault!r}")
            process.die(ExitStatus(code=-11, detail="segmentation fault"))
            return
        dev = self.devices[fault.device]
        taken = max(0, min(fault.bytes, dev.capacity - dev.used - dev.foreign))
        dev.foreign += taken
        self.fault_log.append(f"{trio.current_time():.3f} {fault!r} took {taken}")
        if fault.until is not None:
            await trio.sleep_until(fault.until)
            dev.foreign -= taken


__all__ = [
    "FIT_MARGIN",
    "FIT_MIN_CONTEXT",
    "HOST_TO_GPU_SPEED",
    "CrashWhileLoading",
    "CrashWhileServing",
    "Fault",
    "ForeignMemory",
    "GiB",
    "HangOnLoad",
    "Ledger",
    "MachineSpec",
    "MiB",
    "ModelSpec",
    "OomKill",
    "SimDevice",
    "SimProcess",
    "SimWorld",
    "SlowStart",
]

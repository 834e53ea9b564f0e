"""Measuring one backend: start it alone, sample it through start-up and a
worst-case warm-up, keep the peaks.

:func:`measure_profile` is what ``yard probe`` runs; the engine does the same
sampling itself during a first load (through the :class:`~yard.ports.Meter`
port). Rules it keeps:

- One reading before the launch: the device figures the backend is measured
  against (NVML's device-delta fallback needs it, and the probe shows what
  else was using each device).
- Samples every ``interval_s`` (100-250 ms) from launch until the end of the
  warm-up, plus one last reading once it has settled; the profile is the
  peak per device. Peaks shorter than the interval can be missed; the margin
  (``profile_margin``) and raising on live use cover them.
- The process is stopped in every case, also when the caller's timeout or a
  failure ends the measurement.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import outcome
import trio

from yard.core.spec import HOST, Profile
from yard.memory.readings import DeviceDetail
from yard.ports import Launcher, TellsWhatItTook, Took

Phase = Literal["before", "loading", "warm-up", "settling", "done"]


class DetailMeter(Protocol):
    """A meter that also gives the rich view (every meter in yard.memory)."""

    async def read_details(self, pids: Mapping[str, int]) -> list[DeviceDetail]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """What one measured load of a backend showed.

    gpus: the GPUs it was placed on.
    load_s: launch to ready (health check and configured warm-up included).
    warmup_s: the extra worst-case request's duration (None: none was sent).
    peak_bytes, steady_bytes: per device it held memory on, the highest held
        figure and the one after warm-up once settled.
    reclaimable_bytes: highest file-backed resident host memory (mmap'd model).
    before: the devices just before launch.
    attribution: per device, how its figures were obtained.
    notes: fallbacks taken, for people.
    context: the context size it was started with (None: no range).
    parallel: the slot count it was started with (None: no range).
    took: what the server reported taking once ready (llama-server's
        ``/props``: a slot's context, its slots; None: nothing reported).
    """

    backend: str
    gpus: tuple[str, ...]
    load_s: float
    warmup_s: float | None
    peak_bytes: Mapping[str, int]
    steady_bytes: Mapping[str, int]
    reclaimable_bytes: int
    samples: int
    before: tuple[DeviceDetail, ...] = ()
    attribution: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    context: int | None = None
    parallel: int | None = None
    took: Took | None = None

    @property
    def peak_gpu_bytes(self) -> int:
        """The largest peak over its GPUs (a profile holds one GPU figure)."""
        return max((b for d, b in self.peak_bytes.items() if d != HOST), default=0)

    @property
    def steady_gpu_bytes(self) -> int:
        return max((b for d, b in self.steady_bytes.items() if d != HOST), default=0)

    def profile(self) -> Profile:
        """The profile the core uses (peaks, margin not applied)."""
        return Profile(
            gpu_bytes=self.peak_gpu_bytes,
            host_bytes=self.peak_bytes.get(HOST, 0),
            load_s=self.load_s,
            context=self.context,
            parallel=self.parallel,
        )


class _Tracker:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.peak: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.reclaimable = 0
        self.samples = 0
        self.attribution: dict[str, str] = {}
        self.notes: dict[str, str] = {}

    def add(self, details: list[DeviceDetail]) -> None:
        self.samples += 1
        for detail in details:
            usage = detail.backends.get(self.backend)
            if usage is None:
                continue
            self.last[detail.device] = usage.held_bytes
            self.peak[detail.device] = max(self.peak.get(detail.device, 0), usage.held_bytes)
            if detail.device == HOST:
                self.reclaimable = max(self.reclaimable, usage.reclaimable_bytes)
            self.attribution[detail.device] = detail.attribution
            if detail.note:
                self.notes[detail.device] = detail.note


async def measure_profile(
    *,
    backend: str,
    gpus: tuple[str, ...],
    launcher: Launcher,
    meter: DetailMeter,
    interval_s: float = 0.2,
    warmup: Callable[[str], Awaitable[None]] | None = None,
    settle_s: float = 1.0,
    on_sample: Callable[[Phase, list[DeviceDetail]], None] | None = None,
    context: int | None = None,
    parallel: int | None = None,
) -> Measurement:
    """Launch ``backend`` on ``gpus``, measure it, stop it, return the figures.

    warmup: called with the backend's base URL once it is ready, to drive it
        to its worst case (e.g. :func:`yard.memory.warmup.fill_llama_context`)
        when its configured warm-up does not already.
    on_sample: called with every reading (progress displays).
    context: the context size to start it with (a backend with a context
        range; None: its maximum); the measurement and its profile carry it.
    parallel: likewise the slot count (a backend with a parallel range).

    The caller bounds the whole measurement (``trio.fail_after``). Raises
    :class:`yard.ports.BackendStartError` if the backend fails to start, and
    whatever ``warmup`` raises; the process is stopped either way.
    """
    tracker = _Tracker(backend)
    took: Took | None = None
    phase: Phase = "before"
    before = await meter.read_details({})
    if on_sample is not None:
        on_sample(phase, before)
    process = await launcher.launch(backend, gpus, context=context, parallel=parallel)
    started = trio.current_time()
    pid = process.pid
    pids = {backend: pid} if pid is not None else {}

    async def sample() -> None:
        details = await meter.read_details(pids)
        tracker.add(details)
        if on_sample is not None:
            on_sample(phase, details)

    async def sample_forever() -> None:
        while True:
            await sample()
            await trio.sleep(interval_s)

    async def load_and_warm_up() -> tuple[float, float | None]:
        nonlocal phase
        await process.wait_ready()
        nonlocal took
        took = process.took if isinstance(process, TellsWhatItTook) else None
        load_s = trio.current_time() - started
        warmup_s = None
        if warmup is not None:
            phase = "warm-up"
            warm_start = trio.current_time()
            await warmup(process.base_url)
            warmup_s = trio.current_time() - warm_start
        phase = "settling"
        await trio.sleep(settle_s)
        return load_s, warmup_s

    try:
        async with trio.open_nursery() as nursery:
            phase = "loading"
            nursery.start_soon(sample_forever)
            # Captured, so that a failed start reaches the caller as itself,
            # not wrapped in the sampler nursery's exception group.
            result = await outcome.acapture(load_and_warm_up)
            nursery.cancel_scope.cancel()
        load_s, warmup_s = result.unwrap()
        await sample()
        phase = "done"
    finally:
        with trio.CancelScope(shield=True):
            await process.stop()
    return Measurement(
        backend=backend,
        gpus=gpus,
        load_s=load_s,
        warmup_s=warmup_s,
        peak_bytes=dict(tracker.peak),
        steady_bytes=dict(tracker.last),
        reclaimable_bytes=tracker.reclaimable,
        samples=tracker.samples,
        before=tuple(before),
        attribution=dict(tracker.attribution),
        notes=tuple(f"{device}: {note}" for device, note in sorted(tracker.notes.items())),
        context=context,
        parallel=parallel,
        took=took,
    )

"""Memory for the engine: the meter loop, the sampling of a measured first load,
and the durable profile store.

The engine only reports what the meter reads; the core decides what a reading
means (a backend above its profile gets its profile raised, as a
``ProfileRaised`` decision that the engine then stores).

A meter or store that raises is logged and skipped: memory trouble never takes the
engine down. Every figure reaches the core as an event sent through ``send_event``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

import trio

from yard.core.events import Event, MemoryMeasured, ProfileMeasured
from yard.core.spec import HOST, Profile
from yard.engine.records import BackendRecord, Policy, track_peaks
from yard.ports import DeviceReading, Meter, ProfileStore

log = logging.getLogger("yard.engine")


class Metering:
    """Reads memory and keeps profiles for one engine.

    policy: the scheduler, asked for the profile it holds of a backend.
    meter: reads memory (None: no measurements). profiles: durable profiles
        (None: nothing persisted).
    records: the engine's backend records, by name (read, never changed here).
    send_event: hands an event to the core. spawn: starts a task in the engine's
        nursery (nothing before the engine runs).
    meter_interval_s: how often the meter is read while serving.
    profile_interval_s: how often it is read during a measured first load.
    """

    def __init__(
        self,
        *,
        policy: Policy,
        meter: Meter | None,
        profiles: ProfileStore | None,
        records: Mapping[str, BackendRecord],
        send_event: Callable[[Event], None],
        spawn: Callable[..., None],
        meter_interval_s: float,
        profile_interval_s: float,
    ) -> None:
        self.meter = meter
        self.profile_interval_s = profile_interval_s
        self._policy = policy
        self._profiles = profiles
        self._records = records
        self._send_event = send_event
        self._spawn = spawn
        self._meter_interval_s = meter_interval_s
        self._failures = 0
        self._by_delta: set[str] = set()

    @property
    def by_delta(self) -> frozenset[str]:
        """The devices where the meter fell back to device deltas while yard
        ran (it could not tell the backends apart; first loads go alone)."""
        return frozenset(self._by_delta)

    def pids(self) -> dict[str, int]:
        """The process id of every backend process that has one."""
        pids: dict[str, int] = {}
        for name, record in self._records.items():
            if record.process is not None and record.process.pid is not None:
                pids[name] = record.process.pid
        return pids

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        """Read the meter; a failed read (a driver hiccup) is logged and yields
        nothing, so that memory trouble never takes the engine down."""
        assert self.meter is not None
        try:
            return await self.meter.read(pids)
        except Exception:
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.exception("reading memory failed (%d times so far)", self._failures)
            return []

    async def read_once(self) -> None:
        """One reading of every device, told to the core."""
        self.take_readings(await self.read(self.pids()))

    async def run(self) -> None:
        """Read every device every ``meter_interval_s`` after the first
        reading (:meth:`read_once`, which the engine takes before it serves),
        until cancelled."""
        while True:
            await trio.sleep(self._meter_interval_s)
            await self.read_once()

    async def sample_first_load(self, record: BackendRecord) -> None:
        """Track ``record``'s peaks every ``profile_interval_s``, until cancelled."""
        assert self.meter is not None
        while True:
            readings = await self.read(self.pids())
            track_peaks(record, readings)
            await trio.sleep(self.profile_interval_s)

    async def last_sample(self, record: BackendRecord) -> None:
        """One more reading into ``record``'s peaks, once it is ready: a load
        shorter than a reading (a busy machine) must not be profiled at
        nothing, as if the backend needed no memory."""
        if self.meter is not None:
            track_peaks(record, await self.read(self.pids()))

    def finish_measurement(self, record: BackendRecord) -> Profile:
        """Turn the peaks seen during a first load into a profile and tell the core."""
        load_s = trio.current_time() - record.launched_at
        gpu = max((b for d, b in record.peaks.items() if d != HOST), default=0)
        profile = Profile(
            gpu_bytes=gpu,
            host_bytes=record.peaks.get(HOST, 0),
            load_s=load_s,
            context=record.context,
            parallel=record.parallel,
        )
        record.measure = False
        self._send_event(
            ProfileMeasured(
                backend=record.name,
                gpu_bytes=profile.gpu_bytes,
                host_bytes=profile.host_bytes,
                load_s=profile.load_s,
                source="measured",
                context=profile.context,
                parallel=profile.parallel,
            )
        )
        return profile

    def raised(self, backend: str, profile: Profile) -> None:
        """The core raised ``backend``'s profile (from a live reading, or after
        an out-of-memory it caused): store it."""
        self._spawn(self.store_profile, backend, profile)

    async def store_profile(self, backend: str, profile: Profile) -> None:
        """Persist ``profile`` (best effort: a failure is logged)."""
        if self._profiles is None:
            return
        try:
            await self._profiles.put(backend, profile)
        except Exception:
            # Persisting is best effort: the core already has the figure.
            log.exception("could not store the profile of %s", backend)

    async def load_stored_profiles(
        self, handle: Callable[[Event], Any], only: Collection[str] | None = None
    ) -> None:
        """Hand ``handle`` a ``ProfileMeasured("stored")`` for every backend the
        policy knows that has a stored profile (``only``: of these alone)."""
        if self._profiles is None:
            return
        now = trio.current_time()
        names = (
            [view.name for view in self._policy.snapshot(now, 0).backends]
            if only is None
            else sorted(only)
        )
        for name in names:
            profile = await self._profiles.get(name)
            if profile is not None:
                handle(
                    ProfileMeasured(
                        backend=name,
                        gpu_bytes=profile.gpu_bytes,
                        host_bytes=profile.host_bytes,
                        load_s=profile.load_s,
                        source="stored",
                        context=profile.context,
                        gpu_per_token=profile.gpu_per_token,
                        host_per_token=profile.host_per_token,
                        parallel=profile.parallel,
                        gpu_per_slot=profile.gpu_per_slot,
                        host_per_slot=profile.host_per_slot,
                    )
                )

    def take_readings(self, readings: list[DeviceReading]) -> None:
        """Send the core one ``MemoryMeasured`` per reading (it raises the
        profile of a backend seen above it); the peaks of a backend being
        measured on its first load are tracked here."""
        seen: set[str] = set()
        for reading in readings:
            if reading.by_delta and reading.device not in self._by_delta:
                self._by_delta.add(reading.device)
                log.warning(
                    "%s: the meter fell back to device deltas (it cannot tell the backends "
                    "apart there); first loads there are measured alone from now on",
                    reading.device,
                )
            self._send_event(
                MemoryMeasured(
                    device=reading.device,
                    used_bytes=reading.used_bytes,
                    backends=tuple(sorted(reading.backends.items())),
                    by_delta=reading.by_delta,
                )
            )
            seen.update(reading.backends)
        for name in sorted(seen):
            record = self._records.get(name)
            if record is not None and record.measure:
                track_peaks(record, readings)

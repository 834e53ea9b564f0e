"""Fakes of the ports (:mod:`yard.ports`), for the engine and everything above
it: a scripted policy, a launcher whose processes follow a script on virtual
time, a meter that reads them, and an in-memory profile store. The real ones
are :mod:`yard.supervisor` and :mod:`yard.memory`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from yard.core.decisions import Decision
from yard.core.events import Event, ProfileMeasured
from yard.core.spec import HOST, Profile
from yard.core.views import BackendView, QueuedView, Snapshot
from yard.memory.readings import BackendUsage, DeviceDetail
from yard.ports import BackendStartError, DeviceReading, ExitStatus

React = Callable[[Event, float], list[Decision]]


class ScriptedPolicy:
    """Records every event with its time and answers with ``react(event, now)``."""

    def __init__(self, react: React | None = None, backends: tuple[str, ...] = ()) -> None:
        self.seen: list[tuple[float, Event]] = []
        self.react = react
        self.wakeup: float | None = None
        self.profiles: dict[str, Profile] = {}
        self.backends = backends

    def handle(self, event: Event, now: float) -> list[Decision]:
        self.seen.append((now, event))
        if isinstance(event, ProfileMeasured):
            self.profiles[event.backend] = Profile(
                gpu_bytes=event.gpu_bytes, host_bytes=event.host_bytes, load_s=event.load_s or 0.0
            )
        return self.react(event, now) if self.react is not None else []

    def next_wakeup(self) -> float | None:
        return self.wakeup

    def snapshot(self, now: float, limit: int = 200) -> Snapshot:
        backends = tuple(
            BackendView(
                name=name,
                state="stopped",
                gpus=(),
                inflight=0,
                slots=1,
                served=0,
                loaded_at=None,
                pinned=False,
                profile=self.profiles.get(name),
                last_load_s=None,
                reason="",
            )
            for name in self.backends
        )
        return Snapshot(now=now, devices=(), backends=backends, queue=(), queue_length=0)

    def explain(self, request_id: str, now: float) -> QueuedView | None:
        return None

    def profile(self, backend: str) -> Profile | None:
        return self.profiles.get(backend)

    def events_of(self, kind: type[Event]) -> list[tuple[float, Event]]:
        return [(t, e) for t, e in self.seen if isinstance(e, kind)]


@dataclass
class Script:
    """How one fake backend behaves, times relative to its launch.

    ready_after_s: health check passes then (None: never, a hang).
    fail_after_s: it dies during start-up then (BackendStartError), if set,
        saying ``fail_detail`` (out of memory if ``fail_oom``).
    exit_after_ready_s: it dies this long after becoming ready, if set.
    memory: bytes per device as a function of seconds since launch.
    """

    ready_after_s: float | None = 5.0
    fail_after_s: float | None = None
    fail_oom: bool = False
    fail_detail: str = "crashed while loading"
    exit_after_ready_s: float | None = None
    exit_code: int = -9
    exit_oom: bool = False
    stop_s: float = 1.0
    memory: Callable[[float], Mapping[str, int]] = field(default=lambda t: {})


class FakeProcess:
    def __init__(self, name: str, gpus: tuple[str, ...], script: Script, pid: int) -> None:
        self._name = name
        self.gpus = gpus
        self.script = script
        self._pid = pid
        self.launched_at = trio.current_time()
        self.ready_at: float | None = None
        self.stopped_at: float | None = None
        self.stop_calls = 0
        self._exited = trio.Event()
        self._status = ExitStatus(code=None)

    @property
    def name(self) -> str:
        return self._name

    @property
    def base_url(self) -> str:
        return f"http://fake/{self._name}/{self._pid}"

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def alive(self) -> bool:
        return not self._exited.is_set()

    def _exit(self, status: ExitStatus) -> None:
        if not self._exited.is_set():
            self._status = status
            self._exited.set()

    async def wait_ready(self) -> None:
        script = self.script
        fail_at = math.inf if script.fail_after_s is None else script.fail_after_s
        ready_at = math.inf if script.ready_after_s is None else script.ready_after_s
        if fail_at < ready_at:
            await trio.sleep_until(self.launched_at + fail_at)
            detail = script.fail_detail
            self._exit(ExitStatus(code=1, oom=script.fail_oom, detail=detail))
            raise BackendStartError(detail, oom=script.fail_oom)
        await trio.sleep_until(self.launched_at + ready_at)
        self.ready_at = trio.current_time()

    async def wait_exit(self) -> ExitStatus:
        script = self.script
        if script.exit_after_ready_s is not None and self.ready_at is not None:
            with trio.move_on_at(self.ready_at + script.exit_after_ready_s):
                await self._exited.wait()
            self._exit(ExitStatus(code=script.exit_code, oom=script.exit_oom, detail="died"))
        await self._exited.wait()
        return self._status

    async def stop(self) -> ExitStatus:
        self.stop_calls += 1
        if self.alive:
            await trio.sleep(self.script.stop_s)
            self.stopped_at = trio.current_time()
            self._exit(ExitStatus(code=-15, detail="stopped"))
        return self._status

    def memory(self) -> Mapping[str, int]:
        if not self.alive:
            return {}
        return self.script.memory(trio.current_time() - self.launched_at)


class FakeLauncher:
    def __init__(self, scripts: Mapping[str, Script] | None = None) -> None:
        self.scripts = dict(scripts or {})
        self.launched: list[tuple[float, str, tuple[str, ...]]] = []
        self.processes: list[FakeProcess] = []
        self.refuse: set[str] = set()
        # The ``measure`` flag of each launch, in order.
        self.measured: list[bool] = []
        # The (context, parallel) each launch was given, in order.
        self.settings: list[tuple[int | None, int | None]] = []

    async def launch(
        self,
        backend: str,
        gpus: tuple[str, ...],
        *,
        measure: bool = False,
        context: int | None = None,
        parallel: int | None = None,
    ) -> FakeProcess:
        await trio.lowlevel.checkpoint()
        if backend in self.refuse:
            raise BackendStartError(f"{backend}: no such executable")
        self.launched.append((trio.current_time(), backend, gpus))
        self.measured.append(measure)
        self.settings.append((context, parallel))
        process = FakeProcess(
            backend, gpus, self.scripts.get(backend, Script()), pid=1000 + len(self.processes)
        )
        self.processes.append(process)
        return process

    def latest(self, backend: str) -> FakeProcess:
        return [p for p in self.processes if p.name == backend][-1]


class FakeMeter:
    """A meter of the machine (the surface of :func:`yard.memory.default_meter`
    that the engine and a measured first load read) over figures the test
    sets and, given a ``launcher``, the scripted memory of its processes.

    ``totals`` names the devices and their capacity. A backend's figures
    count only while the reader names it among its ``pids`` (a stopped
    backend holds nothing): those set with :meth:`set_backend` while its name
    is there, a launched process's while its pid is the one named. Foreign
    use (:meth:`set_foreign`) counts always. ``reads``: when each read was.
    """

    mode = "fake"
    mode_detail = "fake meter"

    def __init__(self, totals: Mapping[str, int], launcher: FakeLauncher | None = None) -> None:
        self.totals = dict(totals)
        self.launcher = launcher
        self.foreign: dict[str, int] = {}
        self.reads: list[float] = []
        self._held: dict[str, dict[str, int]] = {device: {} for device in totals}

    def set_backend(self, device: str, backend: str, held_bytes: int) -> None:
        """What ``backend`` holds on ``device`` from now on."""
        self._held[device][backend] = held_bytes

    def set_foreign(self, device: str, used_bytes: int) -> None:
        """What processes outside yard use on ``device`` from now on."""
        self.foreign[device] = used_bytes

    def device_totals(self) -> Mapping[str, int]:
        return self.totals

    def per_process_devices(self) -> frozenset[str]:
        return frozenset(self.totals)

    def sample(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        """One reading of every device, now."""
        self.reads.append(trio.current_time())
        processes = self.launcher.processes if self.launcher is not None else []
        details = []
        for device, total in self.totals.items():
            usage = {
                backend: BackendUsage(held_bytes=held)
                for backend, held in self._held[device].items()
                if backend in pids
            }
            for process in processes:
                used = process.memory().get(device)
                if used and pids.get(process.name) == process.pid:
                    usage[process.name] = BackendUsage(held_bytes=used)
            used = self.foreign.get(device, 0) + sum(u.held_bytes for u in usage.values())
            details.append(
                DeviceDetail(
                    device=device,
                    kind="host" if device == HOST else "gpu",
                    label=device,
                    total_bytes=total,
                    used_bytes=used,
                    backends=usage,
                    attribution="process-tree" if usage else "none",
                )
            )
        return details

    async def read_details(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        await trio.lowlevel.checkpoint()
        return self.sample(pids)

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        await trio.lowlevel.checkpoint()
        return [detail.reading() for detail in self.sample(pids)]


class MemoryProfileStore:
    def __init__(self, profiles: Mapping[str, Profile] | None = None) -> None:
        self.profiles = dict(profiles or {})
        self.puts: list[tuple[float, str, Profile]] = []

    async def get(self, backend: str) -> Profile | None:
        await trio.lowlevel.checkpoint()
        return self.profiles.get(backend)

    async def put(self, backend: str, profile: Profile) -> None:
        await trio.lowlevel.checkpoint()
        self.puts.append((trio.current_time(), backend, profile))
        self.profiles[backend] = profile

    async def forget(self, backend: str) -> None:
        await trio.lowlevel.checkpoint()
        self.profiles.pop(backend, None)


__all__ = [
    "HOST",
    "FakeLauncher",
    "FakeMeter",
    "FakeProcess",
    "MemoryProfileStore",
    "Script",
    "ScriptedPolicy",
]

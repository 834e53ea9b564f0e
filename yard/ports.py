"""The edges of yard: small interfaces through which the outside world enters.

The engine talks to processes, meters and stores only through these
protocols. Each has a real implementation (:mod:`yard.supervisor`,
:mod:`yard.memory`, the profile store of :mod:`yard.memory.profiles`) and a
fake beside it (:mod:`yard.testing.ports`, and ``sim``'s simulated machine),
and both are tested against the same expectations (``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from yard.core.spec import Profile


class BackendStartError(Exception):
    """A backend exited or failed its health check before it became ready.

    ``oom`` tells whether it shows signs of running out of memory.
    """

    def __init__(self, detail: str, *, oom: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.oom = oom


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitStatus:
    """How a backend process ended.

    code: exit code, negative for a signal (-9: SIGKILL), None if unknown.
    oom: signs of out-of-memory (kernel OOM kill, "out of memory" in the log).
    detail: a line for people, with the last log lines where useful.
    """

    code: int | None
    oom: bool = False
    detail: str = ""


class BackendProcess(Protocol):
    """One running instance of a backend, as started by a :class:`Launcher`."""

    @property
    def name(self) -> str:
        """The backend's configured name."""
        ...

    @property
    def base_url(self) -> str:
        """Where it listens, e.g. ``http://127.0.0.1:41234``."""
        ...

    @property
    def pid(self) -> int | None:
        """Root pid of its process tree (None for simulated backends)."""
        ...

    async def wait_ready(self) -> None:
        """Return once it answers its health check (and warm-up, if any).

        Raises :class:`BackendStartError` if it exits first. The caller bounds
        the wait with ``trio.fail_after`` (the start-up timeout).
        """
        ...

    async def wait_exit(self) -> ExitStatus:
        """Return when the process has exited, however that happened."""
        ...

    async def stop(self) -> ExitStatus:
        """SIGTERM to the process group, SIGKILL after the grace period;
        return once every process of the group is gone."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Took:
    """What a server reports it took once ready (llama-server's ``/props``).

    context: a slot's context (``default_generation_settings.n_ctx``).
    slots: its slots (``total_slots``). None: not reported.
    """

    context: int | None = None
    slots: int | None = None


@runtime_checkable
class TellsWhatItTook(Protocol):
    """A :class:`BackendProcess` that reads back what the server took once
    ready (the real supervisor's, for llama-server)."""

    @property
    def took(self) -> Took | None:
        """What it reported (None: nothing, or not ready yet)."""
        ...


class Launcher(Protocol):
    """Starts backend processes."""

    async def launch(
        self,
        backend: str,
        gpus: tuple[str, ...],
        *,
        measure: bool = False,
        context: int | None = None,
        parallel: int | None = None,
    ) -> BackendProcess:
        """Start ``backend`` placed on ``gpus`` and return at once (not ready yet).

        ``measure``: this is a measured first load (the engine is taking the
        backend's memory profile); a launcher that can should then drive the
        backend to its worst-case footprint before it reports ready (the real
        supervisor fills a llama-server slot's context). Launchers with nothing
        to do for it ignore it. ``context``: the context size the core chose
        for a backend with a context range (its ``{context}`` placeholder);
        None for the others. ``parallel``: likewise the slot count chosen
        within a parallel range (``{parallel}``, and ``{total_context}`` =
        context x parallel).

        Raises :class:`BackendStartError` if it cannot even be spawned.
        """
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceReading:
    """One device at one moment.

    used_bytes: in use by everybody (GPU: NVML v2 "used"; host: total minus
        available).
    backends: bytes held on this device by each backend's process tree
        (backend name -> bytes).
    by_delta: the meter could not tell the backends apart here this time
        (NVML's device-delta fallback): a backend's figure is the device's
        growth since it appeared, true only for a load measured alone.
    """

    device: str
    total_bytes: int
    used_bytes: int
    backends: Mapping[str, int]
    by_delta: bool = False


class Meter(Protocol):
    """Reads memory, per device and per backend process tree."""

    def device_totals(self) -> Mapping[str, int]:
        """Capacity of every device it can see (``"host"`` always included)."""
        ...

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        """Read every device now. ``pids`` maps backend name to root pid."""
        ...


class MachineMeter(Meter, Protocol):
    """A whole machine's meter (``yard.memory.default_meter``), as ``yard
    serve`` uses it beside the engine: what it is, for people and for the
    profile keys, and its release."""

    @property
    def mode(self) -> str:
        """``nvml``, ``drm``, ``nvml+drm``, ``apple`` or ``host-only``."""
        ...

    @property
    def mode_detail(self) -> str:
        """A sentence for people: which GPUs, through what; or why host-only."""
        ...

    def describe(self) -> Mapping[str, str]:
        """A label per device (model and size), part of each profile's key."""
        ...

    def per_process_devices(self) -> frozenset[str]:
        """The devices where it tells each backend's memory apart (not by
        device deltas): a first load there is measured next to the others."""
        ...

    def close(self) -> None:
        """Release the libraries it holds (NVML)."""
        ...


class BackendLogs(Protocol):
    """Keeps what backends wrote (the real supervisor does)."""

    def backend_log(self, backend: str) -> list[str]:
        """The backend's last log lines (across restarts), oldest first;
        empty for one it never ran."""
        ...


class ProfileStore(Protocol):
    """Durable profiles, keyed by everything that changes a footprint. The
    implementation computes the key from the backend's configuration (command,
    arguments, model file, devices, server version)."""

    async def get(self, backend: str) -> Profile | None:
        """The stored profile for the backend's current footprint, if any."""
        ...

    async def put(self, backend: str, profile: Profile) -> None:
        """Store (replace) the profile for the backend's current footprint."""
        ...

    async def forget(self, backend: str) -> None:
        """Drop it, so that the next load is measured again."""
        ...

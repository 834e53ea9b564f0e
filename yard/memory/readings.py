"""What a meter sees: richer than the engine's :class:`~yard.ports.DeviceReading`.

The engine needs per-device totals, use and per-backend figures; people
(``yard probe``, ``yard status``, the dashboard) also want to know what part
of a backend's host memory is reclaimable page cache, how much the GPU driver
keeps for itself, and how a figure was obtained. :class:`DeviceDetail` carries
all of it and turns into the engine's reading with :meth:`DeviceDetail.reading`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from yard.core.spec import DeviceKind
from yard.ports import DeviceReading

Attribution = Literal["process-tree", "per-process", "device-delta", "none"]
"""How per-backend figures on a device were obtained.

``process-tree``: host memory read for each process tree (``/proc``; on a
    Mac, each process's physical footprint).
``per-process``: per-process GPU memory summed over each tree: NVML's lists,
    the DRM clients of the tree's fdinfo, or (Apple) the footprints.
``device-delta``: NVML could not attribute memory to processes (not supported,
    no permission, pids from another namespace, implausible figures); each
    backend is credited with the growth of the device's use since just before
    it appeared.
``none``: nothing could be attributed (no backend on the device).
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendUsage:
    """One backend's memory on one device.

    held_bytes: what it holds (host: anon + shmem resident, plus file-backed
        resident pages for a CPU backend; GPU: device memory).
    reclaimable_bytes: host only: file-backed resident pages (an mmap'd model)
        of a GPU backend, which the kernel can drop; not part of ``held_bytes``.
    pids: the processes of its tree that were found holding memory here.
    file_backed_held: host only: its file-backed pages are in ``held_bytes``
        (a CPU backend, whose mmap'd weights are its working set).
    driver_bytes: host only: RAM GPU drivers pinned for its DRM clients (GTT),
        which no resident set shows; part of ``held_bytes``.
    """

    held_bytes: int
    reclaimable_bytes: int = 0
    pids: tuple[int, ...] = ()
    file_backed_held: bool = False
    driver_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceDetail:
    """One device at one moment, with how its figures were obtained.

    total_bytes: the capacity backends may use (GPU: NVML total minus what the
        driver reserves; host: physical RAM).
    used_bytes: in use by everybody (GPU: NVML v2 ``used``, which excludes the
        driver's reserve; host: total minus available).
    reserved_bytes: GPU memory the driver keeps for itself (0 on the host).
    backends: per yard backend on this device.
    attribution: how ``backends`` was obtained.
    note: why a fallback was taken, for people; empty when all went well.
    by_delta: figures here come (or would come) from device deltas: the meter
        cannot tell backends apart on this device now, whether or not any runs.
    """

    device: str
    kind: DeviceKind
    label: str
    total_bytes: int
    used_bytes: int
    reserved_bytes: int = 0
    backends: Mapping[str, BackendUsage] = field(default_factory=dict)
    attribution: Attribution = "none"
    note: str = ""
    by_delta: bool = False

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)

    @property
    def backend_bytes(self) -> int:
        """Sum of what yard's backends hold here."""
        return sum(usage.held_bytes for usage in self.backends.values())

    @property
    def foreign_bytes(self) -> int:
        """What processes yard does not own use here."""
        return max(0, self.used_bytes - self.backend_bytes)

    def reading(self) -> DeviceReading:
        """The engine's view of this device."""
        return DeviceReading(
            device=self.device,
            total_bytes=self.total_bytes,
            used_bytes=self.used_bytes,
            backends={name: usage.held_bytes for name, usage in self.backends.items()},
            by_delta=self.by_delta or self.attribution == "device-delta",
        )


def format_bytes(n: int) -> str:
    """Bytes for people: ``"900 B"``, ``"512.0 MiB"``, ``"79.5 GiB"``."""
    if abs(n) < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"

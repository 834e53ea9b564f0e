"""The meter of a Mac with Apple silicon: unified memory, one GPU.

Theory of operation.

- *Per backend*: the physical footprint of its process tree, summed over
  its processes. It is the kernel's ``ri_phys_footprint`` from
  ``proc_pid_rusage`` (libproc, through ctypes): what Activity Monitor shows
  as a process's memory, and it includes the process's GPU allocations
  (Metal buffers live in the same memory and are charged to the process that
  made them) and its compressed pages. Clean file-backed pages are not in it,
  yet an mmap'd model is the working set of a CPU backend, and llama.cpp's
  Metal backend hands the mmap'd weights to the GPU without a copy: so a
  tree holds the larger of its footprint and its resident size
  (``ri_resident_size``, which has those pages).
- *Devices*: ``host`` is the machine's RAM (``hw.memsize``; use is total
  minus what psutil calls available). ``gpu0`` is the same unified memory as
  the GPU may use it: its capacity is the GPU's working-set limit, from the
  first of:

  1. ``iogpu.wired_limit_mb`` when the user set it (non-zero): the limit the
     GPU driver enforces;
  2. Metal's ``recommendedMaxWorkingSetSize`` when PyObjC's Metal binding is
     installed (``pyobjc-framework-Metal``; not a dependency);
  3. otherwise an approximation of macOS's own default: two thirds of
     ``hw.memsize`` up to 36 GiB of RAM, three quarters above (what Metal
     reports on those machines). The meter's sentence says which was used.

  A GPU backend holds its footprint on both devices (the same bytes count
  against the RAM and against the GPU's limit); a CPU backend only on
  ``host``. Other programs' memory shows on ``host`` only: macOS does not say
  per process how much of it the GPU uses.

Everything macOS-specific sits behind :class:`MacSource`; this module
imports on any system, and tests use a fake source.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import psutil
import trio

from yard.core.spec import HOST
from yard.memory.gpus import GpuLayout, GpuPlace, placed_on_cpu
from yard.memory.readings import BackendUsage, DeviceDetail, format_bytes
from yard.ports import DeviceReading

log = logging.getLogger(__name__)

GIB = 1 << 30
SMALL_MAC_BYTES = 36 * GIB
"""Up to this much RAM the default GPU limit is two thirds of it, above three quarters."""

GPU = "gpu0"


class AppleUnavailable(Exception):
    """Not a Mac, or libproc cannot be used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Footprint:
    """One process's memory: ``phys_bytes`` (physical footprint, GPU
    allocations included) and ``resident_bytes`` (resident set)."""

    phys_bytes: int
    resident_bytes: int


class MacSource(Protocol):
    """What the Apple meter reads from macOS (a fake in tests)."""

    def unified_gpu(self) -> bool:
        """Whether this is Apple silicon (an Intel Mac's GPU is not metered)."""
        ...

    def chip(self) -> str:
        """The chip's name, e.g. ``Apple M2 Max``."""
        ...

    def memsize(self) -> int:
        """Physical RAM in bytes (``hw.memsize``)."""
        ...

    def available(self) -> int:
        """RAM available without swapping, in bytes."""
        ...

    def wired_limit(self) -> int:
        """``iogpu.wired_limit_mb`` in bytes; 0 when unset (macOS's default)."""
        ...

    def metal_working_set(self) -> int | None:
        """Metal's ``recommendedMaxWorkingSetSize``, or None without a binding."""
        ...

    def tree(self, pid: int) -> list[int]:
        """The pid and its descendants (root first); [] when it is gone."""
        ...

    def footprint(self, pid: int) -> Footprint | None:
        """A process's memory, or None when it is gone or unreadable."""
        ...

    def environ(self, pid: int) -> dict[str, str] | None:
        """A process's environment, or None when unreadable."""
        ...


def default_gpu_limit(memsize: int) -> int:
    """macOS's default GPU working-set limit, approximated (see the module
    docstring): 2/3 of RAM up to 36 GiB, 3/4 above."""
    return memsize * 2 // 3 if memsize <= SMALL_MAC_BYTES else memsize * 3 // 4


def gpu_limit(source: MacSource) -> tuple[int, str]:
    """The GPU's working-set limit and where it came from."""
    wired = source.wired_limit()
    if wired > 0:
        return wired, "iogpu.wired_limit_mb"
    metal = source.metal_working_set()
    if metal:
        return metal, "Metal recommendedMaxWorkingSetSize"
    return default_gpu_limit(source.memsize()), (
        "macOS's default, approximated as "
        + ("2/3" if source.memsize() <= SMALL_MAC_BYTES else "3/4")
        + " of RAM (no Metal binding installed)"
    )


class AppleMeter:
    """Host RAM and the GPU's share of unified memory on Apple silicon; on an
    Intel Mac, host RAM only (``mode`` ``host-only``)."""

    def __init__(self, source: MacSource) -> None:
        self._source = source
        self._limiter = trio.CapacityLimiter(1)
        self._memsize = source.memsize()
        self._chip = source.chip()
        self._unified = source.unified_gpu()
        if self._unified:
            self._gpu_total, self._limit_from = gpu_limit(source)
            self.mode = "apple"
            self.mode_detail = (
                f"Apple silicon, unified memory metered per process tree (physical footprint): "
                f"{GPU} ({self._chip}, {format_bytes(self._gpu_total)} GPU working-set limit "
                f"from {self._limit_from}) within {format_bytes(self._memsize)} of RAM"
            )
        else:
            self._gpu_total, self._limit_from = 0, ""
            self.mode = "host-only"
            self.mode_detail = (
                f"host-only mode: an Intel Mac ({self._chip}), whose GPU is not metered; "
                "host RAM metered per process tree (physical footprint)"
            )

    def layout(self) -> GpuLayout:
        if not self._unified:
            return GpuLayout()
        return GpuLayout(places=(GpuPlace(name=GPU, vendor="apple", index=0),), counts={"apple": 1})

    def device_totals(self) -> Mapping[str, int]:
        totals = {HOST: self._memsize}
        if self._unified:
            totals[GPU] = self._gpu_total
        return totals

    def per_process_devices(self) -> frozenset[str]:
        """Both devices: each process's physical footprint."""
        return frozenset(self.device_totals())

    def describe(self) -> Mapping[str, str]:
        labels = {HOST: f"host RAM {self._memsize} bytes"}
        if self._unified:
            labels[GPU] = f"{self._chip} unified {self._gpu_total} bytes"
        return labels

    def sample(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        """Read both devices now (blocking: a few syscalls per process)."""
        host: dict[str, BackendUsage] = {}
        gpu: dict[str, BackendUsage] = {}
        for backend, root in pids.items():
            tree = self._source.tree(root)
            phys = resident = 0
            present = []
            for pid in tree:
                figures = self._source.footprint(pid)
                if figures is None:
                    continue
                present.append(pid)
                phys += figures.phys_bytes
                resident += figures.resident_bytes
            on_cpu = bool(tree) and placed_on_cpu(self._source.environ(tree[0]))
            held = max(phys, resident)
            host[backend] = BackendUsage(
                held_bytes=held, pids=tuple(present), file_backed_held=resident > phys
            )
            gpu[backend] = BackendUsage(held_bytes=0 if on_cpu else held, pids=tuple(present))
        used = max(0, self._memsize - self._source.available())
        gpu_used = min(self._gpu_total, sum(u.held_bytes for u in gpu.values()))
        host_detail = DeviceDetail(
            device=HOST,
            kind="host",
            label="unified memory (RAM)" if self._unified else "host RAM",
            total_bytes=self._memsize,
            used_bytes=used,
            backends=host,
            attribution="process-tree" if host else "none",
        )
        if not self._unified:
            return [host_detail]
        return [
            host_detail,
            DeviceDetail(
                device=GPU,
                kind="gpu",
                label=self._chip,
                total_bytes=self._gpu_total,
                used_bytes=gpu_used,
                backends=gpu,
                attribution="per-process" if gpu else "none",
                note="other programs' GPU memory is not seen here (it shows on host)",
            ),
        ]

    async def read_details(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        return await trio.to_thread.run_sync(self.sample, dict(pids), limiter=self._limiter)

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        return [detail.reading() for detail in await self.read_details(pids)]

    def close(self) -> None:
        """Nothing to release."""


# -- the real source ----------------------------------------------------------

_RUSAGE_INFO_V2 = 2


class _RusageInfoV2(ctypes.Structure):
    """``struct rusage_info_v2`` from <sys/resource.h>."""

    _fields_ = [
        ("ri_uuid", ctypes.c_uint8 * 16),
        ("ri_user_time", ctypes.c_uint64),
        ("ri_system_time", ctypes.c_uint64),
        ("ri_pkg_idle_wkups", ctypes.c_uint64),
        ("ri_interrupt_wkups", ctypes.c_uint64),
        ("ri_pageins", ctypes.c_uint64),
        ("ri_wired_size", ctypes.c_uint64),
        ("ri_resident_size", ctypes.c_uint64),
        ("ri_phys_footprint", ctypes.c_uint64),
        ("ri_proc_start_abstime", ctypes.c_uint64),
        ("ri_proc_exit_abstime", ctypes.c_uint64),
        ("ri_child_user_time", ctypes.c_uint64),
        ("ri_child_system_time", ctypes.c_uint64),
        ("ri_child_pkg_idle_wkups", ctypes.c_uint64),
        ("ri_child_interrupt_wkups", ctypes.c_uint64),
        ("ri_child_pageins", ctypes.c_uint64),
        ("ri_child_elapsed_abstime", ctypes.c_uint64),
        ("ri_diskio_bytesread", ctypes.c_uint64),
        ("ri_diskio_byteswritten", ctypes.c_uint64),
    ]


class LibprocSource:
    """macOS itself: libproc's ``proc_pid_rusage``, ``sysctlbyname``, psutil
    for process trees and environments, and Metal when PyObjC has it.

    Raises :class:`AppleUnavailable` on any other system.
    """

    def __init__(self, *, platform: str = sys.platform, machine: str | None = None) -> None:
        import platform as platform_module

        if platform != "darwin":
            raise AppleUnavailable(f"not macOS ({platform})")
        self._arm = (machine if machine is not None else platform_module.machine()) == "arm64"
        try:
            self._libproc = ctypes.CDLL(ctypes.util.find_library("proc") or "libproc.dylib")
            self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.dylib")
        except OSError as exc:
            raise AppleUnavailable(f"libproc cannot be loaded ({exc})") from exc
        self._libproc.proc_pid_rusage.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self._libproc.proc_pid_rusage.restype = ctypes.c_int
        self._libc.sysctlbyname.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_void_p,
            ctypes.c_size_t,
        ]
        self._libc.sysctlbyname.restype = ctypes.c_int

    def unified_gpu(self) -> bool:
        return self._arm

    def _sysctl_bytes(self, name: str) -> bytes | None:
        size = ctypes.c_size_t(0)
        if self._libc.sysctlbyname(name.encode(), None, ctypes.byref(size), None, 0) != 0:
            return None
        buffer = ctypes.create_string_buffer(size.value)
        if self._libc.sysctlbyname(name.encode(), buffer, ctypes.byref(size), None, 0) != 0:
            return None
        return buffer.raw[: size.value]

    def _sysctl_int(self, name: str) -> int | None:
        raw = self._sysctl_bytes(name)
        return int.from_bytes(raw, "little") if raw else None

    def chip(self) -> str:
        raw = self._sysctl_bytes("machdep.cpu.brand_string")
        return raw.rstrip(b"\0").decode(errors="replace") if raw else "Apple silicon"

    def memsize(self) -> int:
        return self._sysctl_int("hw.memsize") or psutil.virtual_memory().total

    def available(self) -> int:
        return int(psutil.virtual_memory().available)

    def wired_limit(self) -> int:
        megabytes = self._sysctl_int("iogpu.wired_limit_mb") or 0
        return megabytes << 20

    def metal_working_set(self) -> int | None:
        try:
            import Metal  # type: ignore[import-not-found]  # pyobjc-framework-Metal, optional
        except ImportError:
            return None
        device: Any = Metal.MTLCreateSystemDefaultDevice()
        return int(device.recommendedMaxWorkingSetSize()) if device is not None else None

    def tree(self, pid: int) -> list[int]:
        try:
            process = psutil.Process(pid)
            return [pid] + [child.pid for child in process.children(recursive=True)]
        except psutil.Error:
            return []

    def footprint(self, pid: int) -> Footprint | None:
        info = _RusageInfoV2()
        if self._libproc.proc_pid_rusage(pid, _RUSAGE_INFO_V2, ctypes.byref(info)) != 0:
            return None
        return Footprint(
            phys_bytes=int(info.ri_phys_footprint), resident_bytes=int(info.ri_resident_size)
        )

    def environ(self, pid: int) -> dict[str, str] | None:
        try:
            return dict(psutil.Process(pid).environ())
        except psutil.Error:
            return None


def open_apple(source: MacSource | None = None) -> AppleMeter:
    """The Apple meter over ``source`` (default: this Mac). Raises
    :class:`AppleUnavailable` when this is not a Mac or libproc cannot load."""
    return AppleMeter(source if source is not None else LibprocSource())

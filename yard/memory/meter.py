"""The meters behind the engine's :class:`~yard.ports.Meter` port.

:func:`default_meter` picks what the machine has and says which, once in the
log and in ``mode_detail`` (``yard status``, ``/metrics``, ``yard probe``):

- Linux: host RAM always (``/proc``), plus NVIDIA GPUs through NVML, plus
  AMD, Intel and other GPUs through the kernel's DRM interface (fdinfo and
  sysfs, :mod:`yard.memory.drm`), each where present; ``mode`` is
  ``nvml``, ``drm``, ``nvml+drm``, or ``host-only`` when no GPU can be
  metered (with why: no driver, no GPU, a card whose driver reports no size).
- macOS on Apple silicon: unified memory, one GPU (:mod:`yard.memory.apple`);
  ``mode`` is ``apple``.

GPUs are named by :mod:`yard.memory.gpus` (NVIDIA first, then the others in
PCI slot order), and the layout is recorded so that the supervisor sets each
vendor's visible-devices variable. The fake beside it is
``yard.testing.ports.FakeMeter``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import trio

from yard.core.spec import HOST
from yard.memory import procfs
from yard.memory.apple import AppleMeter, AppleUnavailable, MacSource, open_apple
from yard.memory.drm import SYS, DrmMeter, layout_for, open_amdsmi, scan_cards
from yard.memory.gpus import GpuPlace, record_layout
from yard.memory.host import HostMeter
from yard.memory.nvml import NvmlMeter, NvmlUnavailable, open_nvml
from yard.memory.pids import PidSpace
from yard.memory.readings import DeviceDetail
from yard.ports import DeviceReading

log = logging.getLogger(__name__)


class GpuMeter(Protocol):
    """A meter of some GPUs, read together with the host (NVML, DRM)."""

    mode: str

    def device_totals(self) -> Mapping[str, int]: ...

    def labels(self) -> Mapping[str, str]: ...

    def describe(self) -> Mapping[str, str]: ...

    def per_process_devices(self) -> frozenset[str]: ...

    def sample(
        self, pids: Mapping[str, int], *, trees: Mapping[str, list[int]] | None = None
    ) -> list[DeviceDetail]: ...

    def close(self) -> None: ...


_THROUGH = {"nvml": "NVML", "drm": "the kernel's DRM interface (fdinfo, sysfs)"}


class SystemMeter:
    """Host RAM and (when present) GPUs of one or more kinds, read together.

    mode: ``"nvml"``, ``"drm"``, ``"nvml+drm"`` when GPUs are metered,
        ``"host-only"`` otherwise.
    mode_detail: a sentence for people (which GPUs, through what; or why none;
        and the cards left unmetered, with why).
    """

    def __init__(
        self,
        host: HostMeter,
        gpus: GpuMeter | Sequence[GpuMeter] | None,
        *,
        why_host_only: str = "",
        unmetered: Sequence[str] = (),
        proc: Path = procfs.PROC,
    ) -> None:
        self._host = host
        if gpus is None:
            self._gpus: list[GpuMeter] = []
        elif isinstance(gpus, Sequence):
            self._gpus = [g for g in gpus if g.device_totals()]
        else:
            self._gpus = [gpus]
        self._proc = proc
        self._pid_space = PidSpace(proc=proc)
        self._limiter = trio.CapacityLimiter(1)
        self.mode = "+".join(g.mode for g in self._gpus) or "host-only"
        parts = []
        for gpu in self._gpus:
            labels = ", ".join(f"{name} ({label})" for name, label in gpu.labels().items())
            parts.append(f"GPUs metered through {_THROUGH.get(gpu.mode, gpu.mode)}: {labels}")
        if not parts:
            parts.append(f"host-only mode: {why_host_only or 'no GPU meter'}")
        if unmetered:
            parts.append("not metered: " + "; ".join(unmetered))
        self.mode_detail = "; ".join(parts)

    def device_totals(self) -> Mapping[str, int]:
        totals = dict(self._host.device_totals())
        for gpu in self._gpus:
            totals.update(gpu.device_totals())
        return totals

    def describe(self) -> Mapping[str, str]:
        """A label per device (product and capacity), for profile keys."""
        labels = dict(self._host.describe())
        for gpu in self._gpus:
            labels.update(gpu.describe())
        return labels

    def per_process_devices(self) -> frozenset[str]:
        """The host (``/proc``, per process tree) and every GPU whose meter
        reads per-process figures there."""
        devices = {HOST}
        for gpu in self._gpus:
            devices |= gpu.per_process_devices()
        return frozenset(devices)

    def sample(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        """Read every device now (blocking). ``pids``: backend -> root pid."""
        roots = self._pid_space.to_proc(pids)
        children = procfs.children_map(proc=self._proc)
        trees = {
            backend: procfs.process_tree(root, proc=self._proc, children=children)
            for backend, root in roots.items()
        }
        gpu_details: list[DeviceDetail] = []
        driver_held: dict[str, int] = {}
        for gpu in self._gpus:
            gpu_details += gpu.sample(pids, trees=trees)
            for backend, held in getattr(gpu, "host_side_bytes", dict)().items():
                driver_held[backend] = driver_held.get(backend, 0) + held
        details = self._host.sample(roots, trees=trees)
        if any(driver_held.values()):
            details = [_with_driver_memory(detail, driver_held) for detail in details]
        return details + gpu_details

    async def read_details(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        """:meth:`sample` in a worker thread (NVML and /proc calls block)."""
        return await trio.to_thread.run_sync(self.sample, dict(pids), limiter=self._limiter)

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        return [detail.reading() for detail in await self.read_details(pids)]

    def close(self) -> None:
        for gpu in self._gpus:
            gpu.close()


def _with_driver_memory(detail: DeviceDetail, driver_held: Mapping[str, int]) -> DeviceDetail:
    """The host detail with the RAM GPU drivers pinned for each backend's
    clients added to what it holds (it is in no resident set)."""
    backends = {
        name: replace(
            usage,
            held_bytes=usage.held_bytes + driver_held.get(name, 0),
            driver_bytes=driver_held.get(name, 0),
        )
        for name, usage in detail.backends.items()
    }
    return replace(detail, backends=backends)


MachineMeter = SystemMeter | AppleMeter
"""What :func:`default_meter` returns: the Linux meter or the Mac's."""


def default_meter(
    *,
    nvml: Any = None,
    proc: Path = procfs.PROC,
    sys_root: Path = SYS,
    amdsmi: Any = None,
    apple: MacSource | None = None,
    platform: str = sys.platform,
) -> MachineMeter:
    """The meter of this machine (see the module docstring), said once in
    the log; its GPU layout is recorded for the supervisor
    (:func:`yard.memory.gpus.record_layout`).

    The recorded layout counts every GPU of each vendor, metered or not, so
    that a backend is shown only the GPUs it was placed on: a GPU yard does
    not meter is hidden from all.

    Test seams: ``nvml`` replaces the ``pynvml`` module (``yard serve`` passes
    :func:`yard.testing.gpu.nvml_from_env`: a fake card named by
    ``$YARD_TESTING_FAKE_GPU``), ``amdsmi`` the
    ``amdsmi`` one (default: imported where installed; ``False``: not used),
    ``proc`` and ``sys_root`` the procfs and sysfs roots, ``apple`` the macOS
    source, and ``platform`` ``sys.platform`` (``"darwin"`` selects the Apple
    meter).
    """
    if platform == "darwin" or apple is not None:
        try:
            mac = open_apple(apple)
        except AppleUnavailable as exc:
            log.warning("no memory meter for this Mac: %s", exc)
            raise
        log.info("memory meter: %s", mac.mode_detail)
        record_layout(mac.layout())
        return mac
    host = HostMeter(proc=proc)
    meters: list[GpuMeter] = []
    nvidia: list[GpuPlace] = []
    why_not: list[str] = []
    try:
        module = open_nvml(nvml)
    except NvmlUnavailable as exc:
        why_not.append(str(exc))
    else:
        nvml_meter = NvmlMeter(module, proc=proc)
        meters.append(nvml_meter)
        nvidia = [
            GpuPlace(name=name, vendor="nvidia", index=int(name.removeprefix("gpu")))
            for name in nvml_meter.device_totals()
        ]
    cards = [c for c in scan_cards(sys_root=sys_root) if c.vendor != "nvidia"]
    layout = layout_for(cards, first_index=len(nvidia), nvidia=nvidia)
    drm_places = [p for p in layout.places if p.vendor != "nvidia"]
    if drm_places:
        module_amd = open_amdsmi(amdsmi) if any(p.vendor == "amd" for p in drm_places) else None
        meters.append(DrmMeter(cards, drm_places, proc=proc, sys_root=sys_root, amdsmi=module_amd))
    unmetered = [
        f"{c.card} {c.label} at {c.pci_slot}: {c.why_unmetered}" for c in cards if c.why_unmetered
    ]
    if not cards and not meters:
        why_not.append("no DRM GPU in sysfs")
    meter = SystemMeter(
        host,
        meters,
        why_host_only="; ".join(why_not) or "no GPU reports its memory",
        unmetered=unmetered,
        proc=proc,
    )
    if meters:
        log.info("memory meter: %s", meter.mode_detail)
    else:
        log.warning("no GPU meter, running in %s", meter.mode_detail)
    record_layout(layout)
    return meter

"""The meters behind the engine's :class:`~yard.ports.Meter` port.

:func:`default_meter` gives what ``yard serve`` uses: host RAM always, plus
every GPU NVML can see, or host-only mode when NVML cannot start (said once in
the log and in :attr:`SystemMeter.mode_detail`, which ``yard status`` shows).
:class:`FakeMeter` is the same interface over figures a test sets.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import trio

from yard.memory import procfs
from yard.memory.host import HostMeter
from yard.memory.nvml import NvmlMeter, NvmlUnavailable, open_nvml
from yard.memory.pids import PidSpace
from yard.memory.readings import BackendUsage, DeviceDetail
from yard.ports import DeviceReading

log = logging.getLogger(__name__)


class SystemMeter:
    """Host RAM and (when present) NVIDIA GPUs, read together.

    mode: ``"nvml"`` when GPUs are metered, ``"host-only"`` otherwise.
    mode_detail: a sentence for ``yard status`` (which GPUs, or why none).
    """

    def __init__(
        self,
        host: HostMeter,
        gpus: NvmlMeter | None,
        *,
        why_host_only: str = "",
        proc: Path = procfs.PROC,
    ) -> None:
        self._host = host
        self._gpus = gpus
        self._proc = proc
        self._pid_space = PidSpace(proc=proc)
        self._limiter = trio.CapacityLimiter(1)
        self.mode: Literal["nvml", "host-only"] = "nvml" if gpus is not None else "host-only"
        if gpus is not None:
            labels = ", ".join(f"{name} ({label})" for name, label in gpus.labels().items())
            self.mode_detail = f"GPUs metered through NVML: {labels}"
        else:
            self.mode_detail = f"host-only mode: {why_host_only or 'no GPU meter'}"

    def device_totals(self) -> Mapping[str, int]:
        totals = dict(self._host.device_totals())
        if self._gpus is not None:
            totals.update(self._gpus.device_totals())
        return totals

    def describe(self) -> Mapping[str, str]:
        """A label per device (product and capacity), for profile keys."""
        labels = dict(self._host.describe())
        if self._gpus is not None:
            labels.update(self._gpus.describe())
        return labels

    def sample(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        """Read every device now (blocking). ``pids``: backend -> root pid."""
        roots = self._pid_space.to_proc(pids)
        children = procfs.children_map(proc=self._proc)
        trees = {
            backend: procfs.process_tree(root, proc=self._proc, children=children)
            for backend, root in roots.items()
        }
        details = self._host.sample(roots, trees=trees)
        if self._gpus is not None:
            details += self._gpus.sample(pids, trees=trees)
        return details

    async def read_details(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        """:meth:`sample` in a worker thread (NVML and /proc calls block)."""
        return await trio.to_thread.run_sync(self.sample, dict(pids), limiter=self._limiter)

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        return [detail.reading() for detail in await self.read_details(pids)]

    def close(self) -> None:
        if self._gpus is not None:
            self._gpus.close()


def default_meter(*, nvml: Any = None, proc: Path = procfs.PROC) -> SystemMeter:
    """Host + NVML, or host-only when NVML cannot start (logged once).

    ``nvml`` replaces the ``pynvml`` module (tests); ``proc`` the procfs root.
    """
    host = HostMeter(proc=proc)
    try:
        module = open_nvml(nvml)
    except NvmlUnavailable as exc:
        log.warning("no GPU meter, running in host-only mode: %s", exc)
        return SystemMeter(host, None, why_host_only=str(exc), proc=proc)
    return SystemMeter(host, NvmlMeter(module, proc=proc), proc=proc)


class FakeMeter:
    """A meter over figures the test sets, for engine and simulation tests.

    ``totals`` names the devices and their capacity. A backend's figures count
    only while its name is among the ``pids`` the reader passes (a stopped
    backend holds nothing); foreign use counts always.
    """

    mode = "fake"
    mode_detail = "fake meter"

    def __init__(self, totals: Mapping[str, int]) -> None:
        self._totals = dict(totals)
        self._held: dict[str, dict[str, int]] = {device: {} for device in totals}
        self._foreign: dict[str, int] = dict.fromkeys(totals, 0)
        self.reads = 0

    def set_backend(self, device: str, backend: str, held_bytes: int) -> None:
        """What ``backend`` holds on ``device`` from now on."""
        self._held[device][backend] = held_bytes

    def set_foreign(self, device: str, used_bytes: int) -> None:
        """What processes outside yard use on ``device`` from now on."""
        self._foreign[device] = used_bytes

    def device_totals(self) -> Mapping[str, int]:
        return dict(self._totals)

    def sample(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        self.reads += 1
        details = []
        for device, total in self._totals.items():
            usage = {
                backend: BackendUsage(held_bytes=held)
                for backend, held in self._held[device].items()
                if backend in pids
            }
            used = self._foreign[device] + sum(u.held_bytes for u in usage.values())
            details.append(
                DeviceDetail(
                    device=device,
                    kind="host" if device == "host" else "gpu",
                    label=device,
                    total_bytes=total,
                    used_bytes=used,
                    backends=usage,
                    attribution="process-tree" if usage else "none",
                )
            )
        return details

    async def read_details(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        return self.sample(pids)

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        return [detail.reading() for detail in self.sample(pids)]

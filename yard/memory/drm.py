"""GPUs through the kernel's DRM interface: AMD (amdgpu), Intel (xe, i915)
and any other driver that reports per-client memory.

Theory of operation.

*The devices* come from sysfs: every ``/sys/class/drm/cardN`` whose
``device/uevent`` names a PCI slot and a driver. A card is metered when its
driver says how much device-local memory it has:

- amdgpu: ``device/mem_info_vram_total`` and ``device/mem_info_vram_used``
  (bytes; ``used`` is everybody's, the desktop included);
- xe: ``device/tileN/physical_vram_size_bytes`` summed over the tiles (the
  physical size: it includes what the firmware keeps). xe reports no VRAM use
  in sysfs, so a device's use is the sum of every DRM client yard can read in
  ``/proc``; clients of other users' processes are missed without privileges,
  which the device's ``note`` says;
- i915 (discrete Arc on the older driver) and others report no size in sysfs
  (i915 answers only through its query ioctl): such a card is *not* metered;
  :func:`scan_cards` says why and the meter's sentence repeats it;
- integrated GPUs with no device memory of their own (an i915 iGPU) are not
  metered either: what they allocate is host RAM.

Where AMD's ``amdsmi`` package is installed (it is not a dependency), its
device totals, use and product names are used for the cards it knows (its
figures come from the same driver; its names are the marketing ones).

*Per backend*: every open DRM file of the backend's process tree shows its
client's memory in ``/proc/PID/fdinfo/FD``, keys as the kernel's
Documentation/gpu/drm-usage-stats.rst defines them:

- ``drm-pdev`` names the device (PCI slot); where it is missing, the fd's
  target (``/dev/dri/renderD128``) is looked up in sysfs;
- ``drm-client-id`` names the client: one client seen through several fds,
  or through processes that share them after a fork, counts once (per device);
  a client whose id is missing (kernels before 5.19) is told apart by its
  ``pasid`` (amdgpu) or else counted per fd, which may count twice, said in
  the note;
- per memory region, the device-local ones (``vram``, ``vramN``, ``localN``):
  ``drm-resident-<region>`` (what sits in device memory now), or on kernels
  from before it existed ``drm-memory-<region>`` (its deprecated alias), or
  else ``drm-total-<region>``. Values are bytes, or carry ``KiB``/``MiB``
  (``GiB`` accepted too);
- a client listed by two backends' trees counts for the first only;
- the host-memory regions (``gtt``, ``cpu``, ``system``) are RAM the driver
  pinned for the client, outside every process's resident set: they are
  added to the backend's host figure (:meth:`DrmMeter.host_side_bytes`), not
  its GPU one. On an APU (Ryzen AI, Strix Halo) that is where a model lives.

The devices are named by :mod:`yard.memory.gpus` (NVIDIA first, then these in
PCI slot order).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yard.memory import procfs
from yard.memory.gpus import VENDOR_IDS, GpuLayout, GpuPlace, Vendor
from yard.memory.readings import Attribution, BackendUsage, DeviceDetail, format_bytes

log = logging.getLogger(__name__)

SYS = Path("/sys")
"""The real sysfs."""

_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_LOCAL_REGION = re.compile(r"(vram|local)\d*")
_HOST_REGION = re.compile(r"(gtt|cpu|system)\d*")
_CARD = re.compile(r"card\d+")


@dataclass(frozen=True, slots=True, kw_only=True)
class DrmCard:
    """One DRM device as sysfs shows it.

    card: its ``/sys/class/drm`` name (``card1``).
    pci_slot: ``0000:03:00.0``.
    vendor: the maker yard knows by PCI vendor id, or None.
    driver: the kernel driver (``amdgpu``, ``xe``, ``i915``, ...).
    label: a product name for people.
    total_bytes: device-local memory; None when the driver reports none.
    uuid: the ROCm runtime's UUID (``GPU-`` + amdgpu's ``unique_id``), or empty.
    why_unmetered: why it is not metered ("" when it is).
    """

    card: str
    pci_slot: str
    vendor: Vendor | None
    driver: str
    label: str
    total_bytes: int | None
    uuid: str = ""
    why_unmetered: str = ""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def _uevent(path: Path) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in (_read(path) or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key] = value
    return fields


def _card_order(name: str) -> int:
    return int(name.removeprefix("card"))


def scan_cards(*, sys_root: Path = SYS) -> list[DrmCard]:
    """Every DRM card with a PCI slot, in PCI slot order (NVIDIA's included;
    the caller leaves those to NVML)."""
    base = sys_root / "class" / "drm"
    try:
        names = sorted((n for n in os.listdir(base) if _CARD.fullmatch(n)), key=_card_order)
    except OSError:
        return []
    cards = []
    for name in names:
        device = base / name / "device"
        uevent = _uevent(device / "uevent")
        slot = uevent.get("PCI_SLOT_NAME", "")
        if not slot:
            continue  # not a PCI device (a virtual or platform display)
        driver = uevent.get("DRIVER", "")
        pci_id = uevent.get("PCI_ID", "")
        vendor = VENDOR_IDS.get("0x" + pci_id.partition(":")[0].lower())
        label = _read(device / "product_name") or f"{driver or 'unknown driver'} [{pci_id}]"
        total, why = _local_memory_total(device, driver)
        unique = _read(device / "unique_id") if driver == "amdgpu" else None
        cards.append(
            DrmCard(
                card=name,
                pci_slot=slot,
                vendor=vendor,
                driver=driver,
                label=label,
                total_bytes=total,
                uuid=f"GPU-{unique}" if unique else "",
                why_unmetered=why,
            )
        )
    return sorted(cards, key=lambda c: c.pci_slot)


def _local_memory_total(device: Path, driver: str) -> tuple[int | None, str]:
    """(device-local memory in bytes, or None and why not)."""
    if driver == "amdgpu":
        total = _read_int(device / "mem_info_vram_total")
        if total:
            return total, ""
        return None, "amdgpu reports no VRAM size (mem_info_vram_total missing or 0)"
    if driver == "xe":
        try:
            tiles = sorted(n for n in os.listdir(device) if re.fullmatch(r"tile\d+", n))
        except OSError:
            tiles = []
        sizes = [_read_int(device / t / "physical_vram_size_bytes") for t in tiles]
        known = [s for s in sizes if s]
        if known:
            return sum(known), ""
        return None, "xe reports no VRAM on this device (integrated: it uses host RAM)"
    if driver == "i915":
        return None, (
            "i915 reports no local-memory size in sysfs (integrated GPUs use host RAM; "
            "a discrete Arc is metered under the xe driver)"
        )
    if driver == "nvidia":
        return None, "NVIDIA GPUs are metered through NVML"
    return None, f"the {driver or 'unknown'} driver reports no device memory size"


# -- fdinfo -----------------------------------------------------------------


def parse_size(value: str) -> int | None:
    """``"23992 KiB"`` -> bytes; a bare number is bytes; None if unreadable."""
    number, _, unit = value.strip().partition(" ")
    if not number.isdigit() or unit.strip() not in _UNITS:
        return None
    return int(number) * _UNITS[unit.strip()]


def parse_fdinfo(text: str) -> dict[str, str]:
    """The ``key: value`` lines of an fdinfo file."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


@dataclass(frozen=True, slots=True, kw_only=True)
class DrmClient:
    """One DRM client's memory, from one fdinfo file.

    key: what tells clients apart on its device (see the module docstring).
    pdev: the device's PCI slot.
    local_bytes: device-local memory it holds.
    host_bytes: host RAM the driver holds for it (``gtt``, ``cpu``,
        ``system`` regions).
    source: the key kind ``local_bytes`` was read from (``resident``,
        ``memory``, ``total``), or ``none`` when it reported no device-local
        region.
    """

    key: str
    pdev: str
    local_bytes: int
    host_bytes: int = 0
    source: str


def client_memory(fields: Mapping[str, str], *, pdev: str, fallback_key: str) -> DrmClient:
    """The device-local memory of one client's fdinfo ``fields``.

    ``pdev``: its device (``drm-pdev``, or found from the fd's target).
    ``fallback_key``: what tells it apart when it has no ``drm-client-id``.
    """
    regions: dict[str, dict[str, int]] = {}
    for name, value in fields.items():
        match = re.fullmatch(r"drm-(resident|memory|total)-(.+)", name)
        if match is None:
            continue
        size = parse_size(value)
        if size is not None:
            regions.setdefault(match.group(2), {})[match.group(1)] = size
    total = host = 0
    sources = set()
    for region, figures in regions.items():
        for kind in ("resident", "memory", "total"):
            if kind not in figures:
                continue
            if _LOCAL_REGION.fullmatch(region):
                total += figures[kind]
                sources.add(kind)
            elif _HOST_REGION.fullmatch(region):
                host += figures[kind]
            break
    client_id = fields.get("drm-client-id")
    if client_id:
        key = f"client {client_id}"
    elif fields.get("pasid"):
        key = f"pasid {fields['pasid']}"
    else:
        key = fallback_key
    return DrmClient(
        key=key,
        pdev=pdev,
        local_bytes=total,
        host_bytes=host,
        source=min(sources, key=("resident", "memory", "total").index) if sources else "none",
    )


def process_clients(pid: int, *, proc: Path = procfs.PROC, sys_root: Path = SYS) -> list[DrmClient]:
    """Every DRM client one process has open (one entry per fd; a client
    behind several fds appears several times with the same key). A process
    that is gone, or whose fds this user may not read, has none."""
    fdinfo = proc / str(pid) / "fdinfo"
    try:
        fds = os.listdir(fdinfo)
    except OSError:
        return []
    clients = []
    for fd in fds:
        text = _read(fdinfo / fd)
        if text is None or "drm-driver" not in text:
            continue
        fields = parse_fdinfo(text)
        pdev = fields.get("drm-pdev") or _pdev_of_fd(proc / str(pid) / "fd" / fd, sys_root)
        if not pdev:
            continue
        clients.append(client_memory(fields, pdev=pdev, fallback_key=f"fd {pid}/{fd}"))
    return clients


def _pdev_of_fd(link: Path, sys_root: Path) -> str:
    """The PCI slot behind an fd that points at ``/dev/dri/NODE``, or ""."""
    try:
        target = os.readlink(link)
    except OSError:
        return ""
    if not target.startswith("/dev/dri/"):
        return ""
    node = target.removeprefix("/dev/dri/")
    return _uevent(sys_root / "class" / "drm" / node / "device" / "uevent").get("PCI_SLOT_NAME", "")


# -- the meter ----------------------------------------------------------------


@dataclass(slots=True)
class _Gpu:
    name: str
    card: DrmCard
    total_bytes: int
    label: str
    amdsmi_handle: Any = None
    notes: list[str] = field(default_factory=list)


class DrmMeter:
    """Reads the metered DRM GPUs (see the module docstring).

    ``places`` names each metered card (:func:`layout_for`; places of other
    meters are skipped); ``cards`` is the scan they came from. ``amdsmi``: an
    initialised ``amdsmi`` module, or None. ``proc`` and ``sys_root`` are the
    procfs and sysfs roots (tests pass fake ones).
    """

    mode = "drm"

    def __init__(
        self,
        cards: Sequence[DrmCard],
        places: Sequence[GpuPlace],
        *,
        proc: Path = procfs.PROC,
        sys_root: Path = SYS,
        amdsmi: Any = None,
    ) -> None:
        self._proc = proc
        self._sys = sys_root
        self._amdsmi = amdsmi
        self._said: set[str] = set()
        self._host_side: dict[str, int] = {}
        by_slot = {card.pci_slot: card for card in cards}
        handles = _amdsmi_handles(amdsmi) if amdsmi is not None else {}
        self._gpus: list[_Gpu] = []
        for place in places:
            card = by_slot.get(place.pci_slot)
            if card is None or card.total_bytes is None:
                continue  # NVML's GPUs, or a card with no size: not ours to read
            handle = handles.get(card.pci_slot)
            total = card.total_bytes
            label = card.label
            if handle is not None:
                total = _amdsmi_call(amdsmi, "amdsmi_get_gpu_memory_total", handle) or total
                label = _amdsmi_name(amdsmi, handle) or label
            self._gpus.append(
                _Gpu(
                    name=place.name, card=card, total_bytes=total, label=label, amdsmi_handle=handle
                )
            )

    def close(self) -> None:
        if self._amdsmi is not None:
            try:
                self._amdsmi.amdsmi_shut_down()
            except Exception:  # a vendor library's own error type; nothing to do
                log.debug("amdsmi_shut_down failed", exc_info=True)

    def per_process_devices(self) -> frozenset[str]:
        """Every metered card: fdinfo gives each client's memory."""
        return frozenset(gpu.name for gpu in self._gpus)

    def device_totals(self) -> Mapping[str, int]:
        return {gpu.name: gpu.total_bytes for gpu in self._gpus}

    def labels(self) -> Mapping[str, str]:
        """Each GPU's product, driver and capacity, for people."""
        return {
            gpu.name: f"{gpu.label}, {gpu.card.driver}, {format_bytes(gpu.total_bytes)}"
            for gpu in self._gpus
        }

    def describe(self) -> Mapping[str, str]:
        """A label per GPU (for profile keys)."""
        return {gpu.name: f"{gpu.label} {gpu.total_bytes} bytes" for gpu in self._gpus}

    def sample(
        self, pids: Mapping[str, int], *, trees: Mapping[str, list[int]] | None = None
    ) -> list[DeviceDetail]:
        """Read every metered DRM GPU now (blocking: sysfs and /proc).

        ``trees``: each backend's process tree in ``/proc`` pids, root first
        (the system meter reads them once for every meter). Without it, each
        root pid of ``pids`` counts alone.
        """
        found = trees if trees is not None else {b: [pid] for b, pid in pids.items()}
        held: dict[str, dict[str, int]] = {gpu.card.pci_slot: {} for gpu in self._gpus}
        holders: dict[str, dict[str, set[int]]] = {slot: {} for slot in held}
        host_side: dict[str, int] = dict.fromkeys(found, 0)
        seen: set[tuple[str, str]] = set()
        per_fd: set[str] = set()
        for backend, tree in found.items():
            for pid in tree:
                for client in process_clients(pid, proc=self._proc, sys_root=self._sys):
                    if (client.pdev, client.key) in seen:
                        continue
                    seen.add((client.pdev, client.key))
                    host_side[backend] += client.host_bytes
                    if client.pdev not in held:
                        continue
                    if client.key.startswith("fd "):
                        per_fd.add(client.pdev)
                    on_device = held[client.pdev]
                    on_device[backend] = on_device.get(backend, 0) + client.local_bytes
                    holders[client.pdev].setdefault(backend, set()).add(pid)
        self._host_side = host_side
        everybody: dict[str, int] | None = None
        details = []
        for gpu in self._gpus:
            slot = gpu.card.pci_slot
            notes = []
            used = self._used(gpu)
            if used is None:
                if everybody is None:
                    everybody = self._all_clients()
                used = everybody.get(slot, 0)
                notes.append(
                    f"{gpu.card.driver} reports no memory use: the device's use is the sum of "
                    "the DRM clients yard can read (other users' processes are not counted)"
                )
            if slot in per_fd:
                notes.append(
                    "some clients have no drm-client-id (kernel before 5.19): "
                    "a client open twice counts twice"
                )
            usage = {
                backend: BackendUsage(
                    held_bytes=held[slot].get(backend, 0),
                    pids=tuple(sorted(holders[slot].get(backend, ()))),
                )
                for backend in found
            }
            attribution: Attribution = "per-process" if usage else "none"
            for note in notes:
                self._say(gpu.name, note)
            details.append(
                DeviceDetail(
                    device=gpu.name,
                    kind="gpu",
                    label=gpu.label,
                    total_bytes=gpu.total_bytes,
                    used_bytes=used,
                    backends=usage,
                    attribution=attribution,
                    note="; ".join(notes),
                )
            )
        return details

    def host_side_bytes(self) -> Mapping[str, int]:
        """Per backend of the last :meth:`sample`: host RAM the GPU drivers
        hold for its DRM clients (GTT and system regions, any DRM device,
        metered or not). These pages are in no process's resident set, so the
        host meter cannot see them; an APU's model lives there."""
        return dict(self._host_side)

    def _used(self, gpu: _Gpu) -> int | None:
        if gpu.amdsmi_handle is not None:
            used = _amdsmi_call(self._amdsmi, "amdsmi_get_gpu_memory_usage", gpu.amdsmi_handle)
            if used is not None:
                return used
        if gpu.card.driver == "amdgpu":
            return _read_int(
                self._sys / "class" / "drm" / gpu.card.card / "device" / "mem_info_vram_used"
            )
        return None

    def _all_clients(self) -> dict[str, int]:
        """Device-local memory of every readable DRM client, per device."""
        seen: set[tuple[str, str]] = set()
        totals: dict[str, int] = {}
        for pid in procfs.all_pids(proc=self._proc):
            for client in process_clients(pid, proc=self._proc, sys_root=self._sys):
                if (client.pdev, client.key) not in seen:
                    seen.add((client.pdev, client.key))
                    totals[client.pdev] = totals.get(client.pdev, 0) + client.local_bytes
        return totals

    def _say(self, key: str, message: str) -> None:
        if (key + message) not in self._said:
            self._said.add(key + message)
            log.warning("%s: %s", key, message)


def layout_for(
    cards: Iterable[DrmCard], *, first_index: int, nvidia: Sequence[GpuPlace] = ()
) -> GpuLayout:
    """Name the metered cards ``gpu<first_index>``, ... in PCI slot order and
    give each its index among its vendor's cards; ``nvidia``: the GPUs NVML
    named, which come first."""
    ordered = sorted(cards, key=lambda c: c.pci_slot)
    counts: dict[Vendor, int] = {"nvidia": len(nvidia)} if nvidia else {}
    places = list(nvidia)
    number = first_index
    for card in ordered:
        if card.vendor is None or card.vendor == "nvidia":
            continue
        index = counts.get(card.vendor, 0)
        counts[card.vendor] = index + 1
        if card.total_bytes is None:
            continue
        places.append(
            GpuPlace(
                name=f"gpu{number}",
                vendor=card.vendor,
                index=index,
                uuid=card.uuid,
                pci_slot=card.pci_slot,
            )
        )
        number += 1
    return GpuLayout(places=tuple(places), counts=counts)


# -- amdsmi (optional) ------------------------------------------------------


def open_amdsmi(module: Any = None) -> Any:
    """Import and initialise AMD's ``amdsmi`` where installed, else None.
    ``module`` replaces the import (tests); ``False`` means do not use it."""
    if module is False:
        return None
    if module is None:
        try:
            import amdsmi  # type: ignore[import-not-found]  # optional, not a dependency
        except ImportError:
            return None
        module = amdsmi
    try:
        module.amdsmi_init()
    except Exception as exc:  # the library's own exception types vary by version
        log.info("amdsmi is installed but did not start (%s); reading sysfs", exc)
        return None
    return module


def _amdsmi_handles(module: Any) -> dict[str, Any]:
    try:
        handles = list(module.amdsmi_get_processor_handles())
        return {str(module.amdsmi_get_gpu_device_bdf(h)).lower(): h for h in handles}
    except Exception as exc:
        log.info("amdsmi lists no GPUs (%s); reading sysfs", exc)
        return {}


def _amdsmi_call(module: Any, function: str, handle: Any) -> int | None:
    try:
        vram = module.AmdSmiMemoryType.VRAM
        return int(getattr(module, function)(handle, vram))
    except Exception as exc:
        log.debug("amdsmi %s failed: %s", function, exc)
        return None


def _amdsmi_name(module: Any, handle: Any) -> str | None:
    try:
        name = module.amdsmi_get_gpu_asic_info(handle).get("market_name")
    except Exception:
        return None
    return str(name) if name else None

"""Where each GPU sits: yard's names, the vendors' numbers, and the
environment that shows a backend only the GPUs it was placed on.

Naming rule (the same on every machine, so a configuration keeps meaning what
it says):

- ``gpu0``, ``gpu1``, ... are numbered NVIDIA first, in NVML's order (PCI bus
  order, which is also CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), then
  every other metered GPU (AMD, Intel, through the kernel's DRM interface) in
  PCI slot order. A machine with one vendor therefore numbers its GPUs as that
  vendor's runtime does, and an NVIDIA machine keeps the names it always had.
- An Apple silicon Mac has one GPU, ``gpu0``: unified memory as the GPU sees it.

Each GPU also has its place in its own vendor's runtime (:class:`GpuPlace`):
the index among *all* that vendor's GPUs in PCI order (integrated ones too,
which the runtimes enumerate even where yard does not meter them) and, where
the driver tells it, a UUID. :func:`visible_devices_env` turns a placement
into the variables each runtime reads:

- NVIDIA: ``CUDA_VISIBLE_DEVICES`` (indices; empty hides every GPU).
- AMD: ``ROCR_VISIBLE_DEVICES`` (the ROCm runtime's own filter, by UUID where
  known, else by index), and ``HIP_VISIBLE_DEVICES`` listing every device
  ROCr then exposes, because HIP also reads ``CUDA_VISIBLE_DEVICES`` when its
  own variable is unset and would take the empty NVIDIA list as its own. To
  hide every AMD GPU: an empty ROCr list and HIP ``-1`` (an index no device
  has: the list ends before it).
- Intel: ``ZE_AFFINITY_MASK`` (Level Zero indices) with
  ``ZE_ENABLE_PCI_ID_DEVICE_ORDER=1`` so that Level Zero numbers devices in PCI
  order; to hide every Intel GPU, the first index past the last device.
- Apple: Metal has no such variable; a backend is placed by its own flags.

And ``YARD_GPUS``: the yard names it was placed on (empty: it computes on the
CPU). The host meter reads it back to tell CPU backends from GPU ones (their
mmap'd weights are their working set, see :mod:`yard.memory.host`).

The meter that names the GPUs records the layout once
(:func:`record_layout`); the supervisor asks :func:`visible_devices_env` at
each launch. Until a layout is recorded (a process without a meter, tests)
the layout is NVIDIA's numbering: ``gpuN`` is CUDA device N.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Vendor = Literal["nvidia", "amd", "intel", "apple"]

PLACEMENT_VARIABLE = "YARD_GPUS"
"""The environment variable that tells a backend's own process tree (and the
host meter) which yard GPUs it was placed on; empty for a CPU backend."""

VENDOR_IDS: Mapping[str, Vendor] = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
"""PCI vendor ids of the GPU makers yard knows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuPlace:
    """One metered GPU.

    name: yard's name (``gpu0``).
    vendor: whose runtime drives it.
    index: its number in its vendor's runtime (PCI order among all that
        vendor's GPUs on the machine).
    uuid: the runtime's UUID for it where known (ROCr: ``GPU-`` and the
        driver's ``unique_id``), else empty.
    pci_slot: its PCI address (``0000:03:00.0``), empty where unknown.
    """

    name: str
    vendor: Vendor
    index: int
    uuid: str = ""
    pci_slot: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuLayout:
    """Every metered GPU, and how many GPUs each vendor's runtime enumerates
    (``counts``: metered or not, integrated included)."""

    places: tuple[GpuPlace, ...] = ()
    counts: Mapping[Vendor, int] = field(default_factory=dict)

    def place(self, name: str) -> GpuPlace | None:
        return next((p for p in self.places if p.name == name), None)


_recorded: GpuLayout | None = None


def record_layout(layout: GpuLayout | None) -> None:
    """Make ``layout`` the machine's (the meter calls this once it has named
    the GPUs); None forgets it."""
    global _recorded
    _recorded = layout


def recorded_layout() -> GpuLayout | None:
    """The layout the meter recorded, if any."""
    return _recorded


def vendor_env(vendor: Vendor, tokens: Sequence[str], *, count: int) -> dict[str, str]:
    """The variables that show ``vendor``'s runtime only ``tokens`` (its
    indices or UUIDs); no tokens hides all of its ``count`` devices."""
    if vendor == "nvidia":
        return {"CUDA_VISIBLE_DEVICES": ",".join(tokens)}
    if vendor == "amd":
        hip = ",".join(str(i) for i in range(len(tokens))) if tokens else "-1"
        return {"ROCR_VISIBLE_DEVICES": ",".join(tokens), "HIP_VISIBLE_DEVICES": hip}
    if vendor == "intel":
        mask = ",".join(tokens) if tokens else str(count)
        return {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1", "ZE_AFFINITY_MASK": mask}
    return {}


def visible_devices_env(gpus: Sequence[str], layout: GpuLayout | None = None) -> dict[str, str]:
    """The environment that shows a backend exactly ``gpus`` (yard names),
    for every vendor on the machine, plus ``YARD_GPUS``.

    ``layout`` defaults to the recorded one (:func:`record_layout`); without
    one, ``gpuN`` is CUDA device N. A name the layout does not know is taken
    the same way (NVIDIA numbering), as before layouts existed.
    """
    layout = layout if layout is not None else _recorded
    chosen: dict[Vendor, list[str]] = {"nvidia": []}
    if layout is not None:
        for vendor in layout.counts:
            chosen.setdefault(vendor, [])
    for name in gpus:
        place = layout.place(name) if layout is not None else None
        if place is None:
            chosen["nvidia"].append(name.removeprefix("gpu"))
        elif place.vendor == "amd" and place.uuid:
            chosen["amd"].append(place.uuid)
        else:
            chosen.setdefault(place.vendor, []).append(str(place.index))
    env = {PLACEMENT_VARIABLE: ",".join(gpus)}
    for vendor, tokens in chosen.items():
        count = layout.counts.get(vendor, 0) if layout is not None else 0
        env.update(vendor_env(vendor, tokens, count=count))
    return env


def placed_on_cpu(env: Mapping[str, str] | None) -> bool:
    """Whether a process environment says yard placed it on no GPU."""
    return env is not None and env.get(PLACEMENT_VARIABLE) == ""

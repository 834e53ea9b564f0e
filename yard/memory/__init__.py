"""Measured memory: meters, profiles, and ``yard probe``.

Layout:

- ``procfs``, ``pids``: reading process trees and their memory from ``/proc``,
  across pid namespaces.
- ``host``, ``nvml``, ``drm``, ``apple``, ``meter``: the meters behind
  :class:`yard.ports.Meter` (host RAM; NVIDIA GPUs through NVML; AMD, Intel
  and other GPUs through the kernel's DRM fdinfo and sysfs; Apple silicon's
  unified memory; all of a machine's together; the fake is
  ``yard.testing.ports.FakeMeter``);
  :func:`default_meter` picks what the machine has, for ``yard serve``.
- ``gpus``: yard's GPU names across vendors, and the visible-devices
  environment of each vendor's runtime for a placement.
- ``readings``: what a meter sees, richer than the engine's reading.
- ``profiles``: the profile key and the SQLite profile store
  (:class:`yard.ports.ProfileStore`).
- ``measure``: measuring one backend's footprint through start-up and warm-up.
- ``llama``: finding llama.cpp's ``llama-server`` binary (its build is part of
  a profile's key).
- ``probe``: the ``yard probe`` command.
"""

from yard.memory.apple import AppleMeter, AppleUnavailable
from yard.memory.drm import DrmMeter
from yard.memory.gpus import visible_devices_env
from yard.memory.host import HostMeter
from yard.memory.meter import MachineMeter, SystemMeter, default_meter
from yard.memory.nvml import NvmlMeter, NvmlUnavailable, open_nvml
from yard.memory.readings import BackendUsage, DeviceDetail

__all__ = [
    "AppleMeter",
    "AppleUnavailable",
    "BackendUsage",
    "DeviceDetail",
    "DrmMeter",
    "HostMeter",
    "MachineMeter",
    "NvmlMeter",
    "NvmlUnavailable",
    "SystemMeter",
    "default_meter",
    "open_nvml",
    "visible_devices_env",
]

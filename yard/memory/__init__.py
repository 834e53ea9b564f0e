"""Measured memory: meters, profiles, and ``yard probe``.

Layout:

- ``procfs``, ``pids``: reading process trees and their memory from ``/proc``,
  across pid namespaces.
- ``host``, ``nvml``, ``meter``: the meters behind :class:`yard.ports.Meter`
  (host RAM, NVIDIA GPUs, both together) and a fake; :func:`default_meter` is
  what ``yard serve`` uses.
- ``readings``: what a meter sees, richer than the engine's reading.
- ``profiles``: the profile key and the SQLite profile store
  (:class:`yard.ports.ProfileStore`).
- ``measure``: measuring one backend's footprint through start-up and warm-up.
- ``probe``: the ``yard probe`` command.
"""

from yard.memory.host import HostMeter
from yard.memory.meter import FakeMeter, SystemMeter, default_meter
from yard.memory.nvml import NvmlMeter, NvmlUnavailable, open_nvml
from yard.memory.readings import BackendUsage, DeviceDetail

__all__ = [
    "BackendUsage",
    "DeviceDetail",
    "FakeMeter",
    "HostMeter",
    "NvmlMeter",
    "NvmlUnavailable",
    "SystemMeter",
    "default_meter",
    "open_nvml",
]

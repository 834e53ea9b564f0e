"""The host-RAM meter: process trees from ``/proc``, the machine from psutil.

What a backend holds depends on where it computes:

- A GPU backend holds ``RssAnon + RssShmem``; its file-backed resident pages
  (``RssFile``: the mmap'd model it copied to the GPU, shared libraries) are
  reported apart as reclaimable, since the kernel may drop them without harm.
- A CPU backend (yard placed it on no GPU: ``YARD_GPUS`` is empty in its
  environment, see :mod:`yard.memory.gpus`) computes on its mmap'd weights:
  those file-backed pages are its working set. Dropping them under pressure
  means reading the model from disk again on every token (page-cache
  thrashing), so they count as held: ``RssAnon + RssShmem + RssFile``, the
  tree's whole resident set. Measured before this rule: a CPU llama-server
  with a 500 MB model held 368 MB by the old rule while 515 MB of its weights
  sat in file-backed pages outside its reservation.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import psutil
import trio

from yard.core.spec import HOST
from yard.memory import procfs
from yard.memory.gpus import placed_on_cpu
from yard.memory.pids import PidSpace
from yard.memory.readings import BackendUsage, DeviceDetail
from yard.ports import DeviceReading


class HostMeter:
    """Reads host memory: the ``"host"`` device and each backend's process tree.

    Per backend: ``RssAnon + RssShmem`` summed over the tree is what a GPU
    backend holds, with ``RssFile`` reported apart as reclaimable; a CPU
    backend holds all three (see the module docstring). The device: ``total`` is
    physical RAM, ``used`` is total minus available (so page cache the kernel
    can drop does not count as used, consistently with the per-backend
    figures).

    ``proc`` is the procfs root (tests pass a fake one).
    """

    mode = "host"

    def __init__(self, *, proc: Path = procfs.PROC) -> None:
        self._proc = proc
        self._pid_space = PidSpace(proc=proc)
        self._limiter = trio.CapacityLimiter(1)

    def device_totals(self) -> Mapping[str, int]:
        return {HOST: psutil.virtual_memory().total}

    def describe(self) -> Mapping[str, str]:
        """A label per device, for the profile key and for people."""
        return {HOST: f"host RAM {psutil.virtual_memory().total} bytes"}

    def trees(self, pids: Mapping[str, int]) -> dict[str, list[int]]:
        """Each backend's process tree (root first, pids as /proc names them),
        from one scan of /proc. ``pids`` are root pids as yard knows them."""
        children = procfs.children_map(proc=self._proc)
        return {
            backend: procfs.process_tree(root, proc=self._proc, children=children)
            for backend, root in self._pid_space.to_proc(pids).items()
        }

    def sample(
        self, pids: Mapping[str, int], *, trees: Mapping[str, list[int]] | None = None
    ) -> list[DeviceDetail]:
        """Read the host device now (blocking; a few ms). ``trees`` reuses a
        scan already made (the NVML meter needs the same trees)."""
        found = trees if trees is not None else self.trees(pids)
        usage: dict[str, BackendUsage] = {}
        for backend, tree in found.items():
            memory = procfs.tree_memory(tree, proc=self._proc)
            on_cpu = bool(tree) and placed_on_cpu(procfs.read_environ(tree[0], proc=self._proc))
            usage[backend] = BackendUsage(
                held_bytes=memory.held_bytes + (memory.file_bytes if on_cpu else 0),
                reclaimable_bytes=0 if on_cpu else memory.reclaimable_bytes,
                pids=memory.pids,
                file_backed_held=on_cpu,
            )
        vm = psutil.virtual_memory()
        return [
            DeviceDetail(
                device=HOST,
                kind="host",
                label="host RAM",
                total_bytes=vm.total,
                used_bytes=max(0, vm.total - vm.available),
                backends=usage,
                attribution="process-tree" if usage else "none",
            )
        ]

    async def read_details(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        """:meth:`sample` in a worker thread, so the event loop never stalls."""
        return await trio.to_thread.run_sync(self.sample, dict(pids), limiter=self._limiter)

    async def read(self, pids: Mapping[str, int]) -> list[DeviceReading]:
        return [detail.reading() for detail in await self.read_details(pids)]

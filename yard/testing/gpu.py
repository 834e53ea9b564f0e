"""A busy GPU for tests: a shared fake device, its allocator, and NVML over it.

A real card is shared by processes that do not know each other: a desktop or
another app holds memory yard does not own, each backend process allocates
from what is left, and ``cudaMalloc`` fails when the rest is too small; the
driver frees a process's memory when it exits; NVML reports the device's use
and each process's. :class:`SharedGpu` is such a card in a small JSON file, so
that real processes share it:

- ``foreign_bytes``: held by a process yard does not own (shown by NVML as
  used, in no process list yard can attribute, as on a desktop);
- :meth:`SharedGpu.allocate` takes bytes for a pid, or raises
  :class:`CudaOutOfMemory` when they do not fit, as ``cudaMalloc`` does; a
  pid that has exited holds nothing (the driver's clean-up);
- :class:`FakeNvml` is a ``pynvml``-shaped module over the file, for
  :class:`yard.memory.NvmlMeter` (``yard serve`` takes it from
  ``$YARD_TESTING_FAKE_GPU``: :func:`yard.memory.meter.default_meter`).

The fake backend (:mod:`yard.testing.backend`, ``--gpu-file``) allocates from
it by its context as llama-server would, and fails with llama.cpp's own lines.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "CudaOutOfMemory", "FakeNvml", "SharedGpu", "llama_oom_lines"]

ENV_VAR = "YARD_TESTING_FAKE_GPU"
"""A :class:`SharedGpu` file: ``yard serve`` meters it as ``gpu0`` instead of
the machine's NVIDIA GPUs (tests only)."""

MIB = 1 << 20


class CudaOutOfMemory(Exception):
    """An allocation did not fit (``cudaErrorMemoryAllocation``)."""

    def __init__(self, wanted: int, free: int) -> None:
        super().__init__(f"cudaMalloc of {wanted} bytes failed: out of memory ({free} free)")
        self.wanted = wanted
        self.free = free


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) holds no GPU memory either.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


@dataclass(slots=True)
class SharedGpu:
    """One fake GPU in a JSON file (created by :meth:`create`)."""

    path: Path

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        total_bytes: int,
        foreign_bytes: int = 0,
        name: str = "NVIDIA H200",
        reserved_bytes: int = 0,
    ) -> SharedGpu:
        state = {
            "name": name,
            "total": total_bytes,
            "reserved": reserved_bytes,
            "foreign": foreign_bytes,
            "allocations": {},
        }
        path.write_text(json.dumps(state))
        return cls(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with self.path.open("r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            state: dict[str, Any] = json.loads(f.read())
            before = json.dumps(state, sort_keys=True)
            live = {p: n for p, n in state["allocations"].items() if _alive(int(p))}
            state["allocations"] = live
            yield state
            if json.dumps(state, sort_keys=True) != before:
                f.seek(0)
                f.truncate()
                f.write(json.dumps(state))

    def state(self) -> dict[str, Any]:
        """The device now: name, total, reserved, foreign, allocations by pid."""
        with self._locked() as state:
            return state

    def free_bytes(self) -> int:
        s = self.state()
        return int(s["total"] - s["reserved"] - s["foreign"] - sum(s["allocations"].values()))

    def allocate(self, pid: int, nbytes: int) -> None:
        """Give ``pid`` ``nbytes`` more, or raise :class:`CudaOutOfMemory`."""
        with self._locked() as s:
            free = s["total"] - s["reserved"] - s["foreign"] - sum(s["allocations"].values())
            if nbytes > free:
                raise CudaOutOfMemory(nbytes, free)
            key = str(pid)
            s["allocations"][key] = s["allocations"].get(key, 0) + nbytes

    def set_foreign(self, nbytes: int) -> None:
        """Another process took (or gave back) memory."""
        with self._locked() as s:
            s["foreign"] = nbytes


def llama_oom_lines(wanted: int, model: str) -> list[str]:
    """What llama-server (CUDA build) logs when its context does not fit."""
    return [
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {wanted / MIB:.2f} MiB on "
        "device 0: cudaMalloc failed: out of memory",
        f"alloc_tensor_range: failed to allocate CUDA0 buffer of size {wanted}",
        "llama_init_from_model: failed to initialize the context: failed to allocate buffer "
        "for kv cache",
        f"common_init_from_params: failed to create context with model '{model}'",
        f"srv    load_model: failed to load model, '{model}'",
    ]


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None  # pynvml's spelling


@dataclass
class _Memory:
    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class FakeNvml:
    """The subset of ``pynvml`` the NVML meter reads, over one :class:`SharedGpu`."""

    NVMLError = _NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    nvmlMemory_v2 = 0x02000028

    def __init__(self, gpu: SharedGpu) -> None:
        self.gpu = gpu

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SharedGpu:
        if index != 0:
            raise _NVMLError(2)
        return self.gpu

    def nvmlDeviceGetName(self, handle: SharedGpu) -> str:
        return str(handle.state()["name"])

    def nvmlDeviceGetUUID(self, handle: SharedGpu) -> str:
        return "GPU-fake-0000"

    def nvmlDeviceGetMemoryInfo(self, handle: SharedGpu, version: int | None = None) -> _Memory:
        s = handle.state()
        used = s["foreign"] + sum(s["allocations"].values())
        free = s["total"] - s["reserved"] - used
        if version is None:  # v1: the reserve counts as used
            return _Memory(total=s["total"], free=free, used=used + s["reserved"])
        return _Memory(
            total=s["total"], free=free, used=used, reserved=s["reserved"], version=version
        )

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: SharedGpu) -> list[_Process]:
        return [_Process(int(p), n) for p, n in handle.state()["allocations"].items()]

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: SharedGpu) -> list[_Process]:
        return []


def nvml_from_env() -> FakeNvml | None:
    """The fake card ``$YARD_TESTING_FAKE_GPU`` names, as a ``pynvml``-shaped
    module for :func:`yard.memory.default_meter` (tests only: ``yard serve``
    reads it so that real processes share one busy card); None when unset."""
    path = os.environ.get(ENV_VAR)
    return FakeNvml(SharedGpu(Path(path))) if path else None

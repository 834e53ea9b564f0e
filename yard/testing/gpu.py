"""A busy GPU for tests: a shared fake device, its allocator, and the one fake
``pynvml``, over that device or over GPUs in memory.

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
  pid that has exited holds nothing (the driver's clean-up).

:class:`FakeNvml` is the ``pynvml`` module as the NVML meter
(:class:`yard.memory.NvmlMeter`) uses it, with the driver's error codes
(``NVMLError(code)`` builds ``NVMLError_NotSupported`` and its kin, calls
before ``nvmlInit`` fail, old drivers lack the ``_v3`` process lists or the
v2 memory info). Its GPUs are :class:`SharedGpu` cards (``yard serve`` takes
one from ``$YARD_TESTING_FAKE_GPU``: :func:`nvml_from_env`) or
:class:`FakeGpu` boards in memory, whose figures and failures a test sets
(the meter's own tests).

The fake backend (:mod:`yard.testing.backend`, ``--gpu-file``) allocates from
a card by its context as llama-server would, and fails with llama.cpp's own
lines."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

__all__ = [
    "ENV_VAR",
    "CudaOutOfMemory",
    "FakeGpu",
    "FakeNvml",
    "NVMLError",
    "NVMLLibraryMismatchError",
    "ProcessInfo",
    "SharedGpu",
    "llama_oom_lines",
    "nvml_from_env",
]

ENV_VAR = "YARD_TESTING_FAKE_GPU"
"""A :class:`SharedGpu` file: ``yard serve`` meters it as ``gpu0`` instead of
the machine's NVIDIA GPUs (tests only)."""

MIB = 1 << 20
GIB = 1 << 30


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


# -- pynvml ------------------------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15


class NVMLError(Exception):
    """``pynvml.NVMLError``: ``NVMLError(code)`` builds the subclass for the
    code (``NVMLError_NotSupported``, ...), which carries ``.value``."""

    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        target = NVMLError._by_code.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return f"NVML error {self.value}"


def _subclass(name: str, code: int) -> type[NVMLError]:
    cls = type(name, (NVMLError,), {})
    NVMLError._by_code[code] = cls
    return cls


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _subclass("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)


class NVMLLibraryMismatchError(Exception):
    """``pynvml``'s answer when a plain call's newest version is missing."""


@dataclass
class ProcessInfo:
    pid: int
    usedGpuMemory: int | None  # pynvml's spelling; None: NVML_VALUE_NOT_AVAILABLE


@dataclass
class MemoryInfo:
    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass
class FakeGpu:
    """One GPU in memory, whose figures the test sets. ``used`` is what the
    device reports in use (excluding the reserve), whatever the process lists
    say; ``process_error`` is the code the process lists fail with."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    total: int = 80 * GIB
    reserved: int = 512 << 20
    used: int = 0
    compute: list[ProcessInfo] = field(default_factory=list)
    graphics: list[ProcessInfo] = field(default_factory=list)
    process_error: int | None = None


def _board(handle: FakeGpu | SharedGpu) -> FakeGpu:
    """The GPU now: a :class:`FakeGpu` as it is, a :class:`SharedGpu` read
    from its file (its foreign memory used but in no process list)."""
    if isinstance(handle, FakeGpu):
        return handle
    s = handle.state()
    return FakeGpu(
        name=str(s["name"]),
        uuid="GPU-fake-0000",
        total=s["total"],
        reserved=s["reserved"],
        used=s["foreign"] + sum(s["allocations"].values()),
        compute=[ProcessInfo(int(pid), n) for pid, n in s["allocations"].items()],
    )


class FakeNvml:
    """The ``pynvml`` module (``nvidia-ml-py`` 12/13) as the NVML meter uses
    it, over GPUs in memory (:class:`FakeGpu`) or shared card files
    (:class:`SharedGpu`): pass an instance where ``pynvml`` would go.

    It fails as the real one does: every call before ``nvmlInit`` or after
    the last ``nvmlShutdown`` raises ``NVMLError_Uninitialized``; a bad index
    ``NVMLError_InvalidArgument``; ``init_error`` makes ``nvmlInit`` fail
    with that code; without ``has_v3`` the ``_v3`` process lists raise
    ``NVMLError_FunctionNotFound`` and the plain ones
    ``NVMLLibraryMismatchError``; without ``has_memory_v2`` the v2 memory
    info raises ``NVMLError_FunctionNotFound``. ``calls`` records the process
    lists read (``"compute_v2"``, ...).
    """

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    nvmlMemory_v2 = 0x02000028

    def __init__(
        self,
        gpus: Sequence[FakeGpu | SharedGpu] | None = None,
        *,
        init_error: int | None = None,
        has_v3: bool = True,
        has_memory_v2: bool = True,
    ) -> None:
        self.gpus = list(gpus) if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.has_v3 = has_v3
        self.has_memory_v2 = has_memory_v2
        self.initialised = 0
        self.calls: list[str] = []

    # -- life ----------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialised -= 1

    def _check(self) -> None:
        if self.initialised <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    # -- devices -------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu | SharedGpu:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu | SharedGpu) -> str:
        self._check()
        return _board(handle).name

    def nvmlDeviceGetUUID(self, handle: FakeGpu | SharedGpu) -> str:
        self._check()
        return _board(handle).uuid

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeGpu | SharedGpu, version: int | None = None
    ) -> MemoryInfo:
        self._check()
        board = _board(handle)
        if version is not None:
            if not self.has_memory_v2:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            free = board.total - board.reserved - board.used
            return MemoryInfo(
                total=board.total,
                free=free,
                used=board.used,
                reserved=board.reserved,
                version=version,
            )
        # v1: the reserve counts as used.
        used = board.used + board.reserved
        return MemoryInfo(total=board.total, free=board.total - used, used=used)

    # -- processes -----------------------------------------------------------

    def _list(self, handle: FakeGpu | SharedGpu, which: str, version: str) -> list[ProcessInfo]:
        self._check()
        self.calls.append(f"{which}{version}")
        if version == "_v3" and not self.has_v3:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        board = _board(handle)
        if board.process_error is not None:
            raise NVMLError(board.process_error)
        source = board.compute if which == "compute" else board.graphics
        return [ProcessInfo(p.pid, p.usedGpuMemory) for p in source]

    def nvmlDeviceGetComputeRunningProcesses_v3(
        self, handle: FakeGpu | SharedGpu
    ) -> list[ProcessInfo]:
        return self._list(handle, "compute", "_v3")

    def nvmlDeviceGetComputeRunningProcesses_v2(
        self, handle: FakeGpu | SharedGpu
    ) -> list[ProcessInfo]:
        return self._list(handle, "compute", "_v2")

    def nvmlDeviceGetComputeRunningProcesses(
        self, handle: FakeGpu | SharedGpu
    ) -> list[ProcessInfo]:
        return self._unversioned(self.nvmlDeviceGetComputeRunningProcesses_v3, handle)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(
        self, handle: FakeGpu | SharedGpu
    ) -> list[ProcessInfo]:
        return self._list(handle, "graphics", "_v3")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(
        self, handle: FakeGpu | SharedGpu
    ) -> list[ProcessInfo]:
        return self._list(handle, "graphics", "_v2")

    def nvmlDeviceGetGraphicsRunningProcesses(
        self, handle: FakeGpu | SharedGpu
    ) -> list[ProcessInfo]:
        return self._unversioned(self.nvmlDeviceGetGraphicsRunningProcesses_v3, handle)

    @staticmethod
    def _unversioned(
        call: Callable[[FakeGpu | SharedGpu], list[ProcessInfo]], handle: FakeGpu | SharedGpu
    ) -> list[ProcessInfo]:
        try:
            return call(handle)
        except NVMLError_FunctionNotFound as exc:
            raise NVMLLibraryMismatchError("unversioned call, mismatched library") from exc


def nvml_from_env() -> FakeNvml | None:
    """The fake card ``$YARD_TESTING_FAKE_GPU`` names, as a ``pynvml``-shaped
    module for :func:`yard.memory.default_meter` (tests only: ``yard serve``
    reads it so that real processes share one busy card); None when unset."""
    path = os.environ.get(ENV_VAR)
    return FakeNvml([SharedGpu(Path(path))]) if path else None

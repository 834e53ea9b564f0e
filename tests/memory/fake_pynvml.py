"""A fake ``pynvml``: the subset the NVML meter uses, with the driver's traps.

It behaves like ``nvidia-ml-py`` 12/13: ``NVMLError(code)`` builds the
subclass for the code (``NVMLError_NotSupported``, ...) and carries
``.value``; the plain process-list functions go through the newest versioned
call and turn a missing symbol into ``NVMLLibraryMismatchError``;
``usedGpuMemory`` is None where the driver says "not available".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

GIB = 1 << 30


class NVMLError(Exception):
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


NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_FunctionNotFound = _subclass("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)


class NVMLLibraryMismatchError(Exception):
    pass


@dataclass
class ProcessInfo:
    pid: int
    usedGpuMemory: int | None  # pynvml's spelling


@dataclass
class MemoryInfo:
    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass
class FakeGpu:
    """One simulated board. ``used`` is what the device reports in use
    (excluding the reserve), whatever the process list says."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    total: int = 80 * GIB
    reserved: int = 512 << 20
    used: int = 0
    compute: list[ProcessInfo] = field(default_factory=list)
    graphics: list[ProcessInfo] = field(default_factory=list)
    process_error: int | None = None


class FakePynvml:
    """Module-shaped fake: pass an instance where ``pynvml`` would go."""

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    nvmlMemory_v2 = 0x02000028

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        has_v3: bool = True,
        has_memory_v2: bool = True,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
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

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check()
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> MemoryInfo:
        self._check()
        if version is not None:
            if not self.has_memory_v2:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            free = handle.total - handle.reserved - handle.used
            return MemoryInfo(
                total=handle.total,
                free=free,
                used=handle.used,
                reserved=handle.reserved,
                version=version,
            )
        # v1: the reserve counts as used.
        used = handle.used + handle.reserved
        return MemoryInfo(total=handle.total, free=handle.total - used, used=used)

    # -- processes -----------------------------------------------------------

    def _list(self, handle: FakeGpu, which: str, version: str) -> list[ProcessInfo]:
        self._check()
        self.calls.append(f"{which}{version}")
        if version == "_v3" and not self.has_v3:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if handle.process_error is not None:
            raise NVMLError(handle.process_error)
        source = handle.compute if which == "compute" else handle.graphics
        return [ProcessInfo(p.pid, p.usedGpuMemory) for p in source]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: FakeGpu) -> list[ProcessInfo]:
        return self._list(handle, "compute", "_v3")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: FakeGpu) -> list[ProcessInfo]:
        return self._list(handle, "compute", "_v2")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[ProcessInfo]:
        return self._unversioned(self.nvmlDeviceGetComputeRunningProcesses_v3, handle)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: FakeGpu) -> list[ProcessInfo]:
        return self._list(handle, "graphics", "_v3")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: FakeGpu) -> list[ProcessInfo]:
        return self._list(handle, "graphics", "_v2")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeGpu) -> list[ProcessInfo]:
        return self._unversioned(self.nvmlDeviceGetGraphicsRunningProcesses_v3, handle)

    @staticmethod
    def _unversioned(call: Any, handle: FakeGpu) -> list[ProcessInfo]:
        try:
            result: list[ProcessInfo] = call(handle)
        except NVMLError_FunctionNotFound as exc:
            raise NVMLLibraryMismatchError("unversioned call, mismatched library") from exc
        return result

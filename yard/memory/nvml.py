"""The GPU meter, through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Theory of operation. Every sample reads, per GPU:

1. the device: v2 memory info (``total``, ``reserved``, ``free``, ``used``);
   yard's capacity is ``total - reserved``, and ``used`` excludes the reserve.
   Drivers without the v2 call fall back to v1 (``used`` then includes the
   reserve, which is reported as 0).
2. the processes: compute and graphics lists (newest call version first,
   ``_v3`` then ``_v2`` then the plain one), merged by pid.
3. attribution: each backend gets the sum over its process tree of the
   per-process figures, matched by pid (yard's pids are translated to the
   ones NVML reports, see :mod:`yard.memory.pids`).

Per-process figures are not always there or not always right, and then the
device falls back to *deltas*: a backend is credited with the growth of the
device's use since just before it appeared (first loads happen alone on their
devices, so this is the backend's own footprint), while earlier backends keep
the figure they had when the next one arrived. The fallback is taken when:

- the lists are refused: ``NVML_ERROR_NOT_SUPPORTED`` (some boards, vGPU),
  ``NVML_ERROR_NO_PERMISSION`` (MIG without privileges), a missing function;
- a figure is unavailable (``usedGpuMemory`` is None, i.e. the driver's
  ``NVML_VALUE_NOT_AVAILABLE``);
- the figures are implausible (one process above the device total, the sum
  above what the device uses, impossible pids): a pynvml/driver mismatch
  reads the structures with the wrong layout. This is sticky for the device:
  a broken pairing stays broken, and flipping between methods would make the
  figures jump;
- NVML reports pids this ``/proc`` cannot see (yard in a container whose pid
  namespace hides the host's pids) while one of yard's GPU backends matched
  nothing: its memory must be among those pids.

Each reason is logged once. A backend whose environment sets
``CUDA_VISIBLE_DEVICES`` to exclude a GPU is never credited on it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yard.memory import procfs
from yard.memory.pids import PidSpace
from yard.memory.readings import Attribution, BackendUsage, DeviceDetail, format_bytes

log = logging.getLogger(__name__)

_PID_MAX = 1 << 22
"""The kernel's upper limit for pid_max: anything above is not a pid."""


class NvmlUnavailable(Exception):
    """NVML cannot be used: no library, no driver, no GPU. yard runs host-only."""


def open_nvml(module: Any = None) -> Any:
    """Import ``pynvml`` (unless a module is given) and initialise it.

    Returns the initialised module. Raises :class:`NvmlUnavailable` with a
    sentence for people when the package, the library or the driver is
    missing, or NVML sees no GPU.
    """
    if module is None:
        try:
            import pynvml
        except ImportError as exc:  # the package is a dependency, but be kind
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
        module = pynvml
    try:
        module.nvmlInit()
    except module.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code == module.NVML_ERROR_LIBRARY_NOT_FOUND:
            why = "the NVIDIA driver library (libnvidia-ml.so.1) is not installed"
        elif code == module.NVML_ERROR_DRIVER_NOT_LOADED:
            why = "the NVIDIA driver is not loaded"
        else:
            why = f"NVML failed to start: {exc}"
        raise NvmlUnavailable(why) from exc
    try:
        count = int(module.nvmlDeviceGetCount())
    except module.NVMLError as exc:
        module.nvmlShutdown()
        raise NvmlUnavailable(f"NVML cannot count GPUs: {exc}") from exc
    if count == 0:
        module.nvmlShutdown()
        raise NvmlUnavailable("NVML sees no GPU")
    return module


class _Refused(Exception):
    """Per-process figures cannot be had on this device right now."""


@dataclass(slots=True)
class _Gpu:
    name: str
    index: int
    handle: Any
    label: str
    uuid: str
    total_bytes: int
    reserved_bytes: int


@dataclass(slots=True)
class _DeltaState:
    """Device-delta attribution of one GPU (see the module docstring).

    known: backend -> root pid (/proc) of every backend seen on the device and
    still alive; reads that pass only some backends (the engine waiting for
    one stopped backend's memory to go) must not make the others "leave".
    """

    last_used: int
    unattributed: int
    known: dict[str, int] = field(default_factory=dict)
    frozen: dict[str, int] = field(default_factory=dict)
    latest: str | None = None


class NvmlMeter:
    """Reads every GPU NVML sees, named ``gpu0``, ``gpu1``, ... by NVML index.

    ``nvml`` is an initialised ``pynvml`` module (see :func:`open_nvml`);
    tests pass a fake with the same functions. ``proc`` is the procfs root.
    :meth:`close` shuts NVML down.
    """

    mode = "nvml"

    def __init__(self, nvml: Any, *, proc: Path = procfs.PROC) -> None:
        self._nvml = nvml
        self._proc = proc
        self._pid_space = PidSpace(proc=proc)
        self._broken: dict[str, str] = {}
        self._deltas: dict[str, _DeltaState] = {}
        self._last_per_process: dict[str, dict[str, int]] = {}
        self._said: set[tuple[str, str]] = set()
        self._gpus: list[_Gpu] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            total, reserved, _used = self._memory(handle)
            self._gpus.append(
                _Gpu(
                    name=f"gpu{index}",
                    index=index,
                    handle=handle,
                    label=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    total_bytes=total - reserved,
                    reserved_bytes=reserved,
                )
            )

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def device_totals(self) -> Mapping[str, int]:
        """Each GPU's capacity for backends: total minus the driver's reserve."""
        return {gpu.name: gpu.total_bytes for gpu in self._gpus}

    def labels(self) -> Mapping[str, str]:
        """Each GPU's product name and capacity, for people."""
        return {gpu.name: f"{gpu.label}, {format_bytes(gpu.total_bytes)}" for gpu in self._gpus}

    def describe(self) -> Mapping[str, str]:
        """A label per GPU: product name and capacity (for profile keys)."""
        return {gpu.name: f"{gpu.label} {gpu.total_bytes} bytes" for gpu in self._gpus}

    def per_process_devices(self) -> frozenset[str]:
        """The GPUs whose per-process lists can be read now, with plausible
        figures and pids this ``/proc`` sees. Elsewhere a backend can only be
        credited with the device's growth, so its first load must be alone.
        (A fallback found later, once backends run, is not seen here.)"""
        devices = set()
        for gpu in self._gpus:
            try:
                found = self._processes(gpu.handle)
            except _Refused:
                continue
            total, reserved, used = self._memory(gpu.handle)
            problem = self._per_process_problem(gpu, found, total, used + reserved, {}, [], set())
            unseen = [pid for pid in found if not (self._proc / str(pid)).is_dir()]
            if problem is None and not unseen:
                devices.add(gpu.name)
        return frozenset(devices)

    # -- reading ---------------------------------------------------------

    def sample(
        self, pids: Mapping[str, int], *, trees: Mapping[str, list[int]] | None = None
    ) -> list[DeviceDetail]:
        """Read every GPU now (blocking: NVML and /proc, a few ms).

        ``pids`` maps backend name to its root pid as yard knows it.
        ``trees`` may give each backend's process tree in ``/proc`` pids
        (the host meter computes the same); otherwise it is read here.
        """
        if trees is None:
            proc_roots = self._pid_space.to_proc(pids)
            children = procfs.children_map(proc=self._proc)
            trees = {
                backend: procfs.process_tree(root, proc=self._proc, children=children)
                for backend, root in proc_roots.items()
            }
        owner = {pid: backend for backend, tree in trees.items() for pid in tree}
        roots = {backend: tree[0] for backend, tree in trees.items() if tree}
        visible = self._visible_gpus(pids)
        entries: dict[str, dict[int, int | None] | str] = {}
        memory: dict[str, tuple[int, int, int]] = {}
        for gpu in self._gpus:
            memory[gpu.name] = self._memory(gpu.handle)
            try:
                entries[gpu.name] = self._processes(gpu.handle)
            except _Refused as refusal:
                entries[gpu.name] = str(refusal)
        matched_somewhere = {
            owner[pid]
            for found in entries.values()
            if isinstance(found, dict)
            for pid in found
            if pid in owner
        }
        details = []
        for gpu in self._gpus:
            total, reserved, used = memory[gpu.name]
            candidates = [b for b in pids if gpu.name in visible.get(b, {gpu.name})]
            found = entries[gpu.name]
            reason = self._per_process_problem(
                gpu, found, total, used + reserved, owner, candidates, matched_somewhere
            )
            attribution: Attribution
            if reason is None:
                assert isinstance(found, dict)
                usage = self._per_process(found, owner, candidates)
                last = self._last_per_process.setdefault(gpu.name, {})
                for backend in list(last):
                    if backend not in roots:
                        del last[backend]
                last.update((b, u.held_bytes) for b, u in usage.items())
                self._deltas.pop(gpu.name, None)
                attribution = "per-process" if candidates else "none"
                note = ""
            else:
                self._say(gpu.name, reason)
                usage = self._by_delta(gpu.name, used, candidates, roots)
                attribution = "device-delta" if candidates else "none"
                note = reason
            details.append(
                DeviceDetail(
                    device=gpu.name,
                    kind="gpu",
                    label=gpu.label,
                    total_bytes=total - reserved,
                    used_bytes=used,
                    reserved_bytes=reserved,
                    backends=usage,
                    attribution=attribution,
                    note=note,
                    by_delta=reason is not None,
                )
            )
        return details

    def _memory(self, handle: Any) -> tuple[int, int, int]:
        """(total, reserved, used excluding reserved) of one GPU."""
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                return int(info.total), int(info.reserved), int(info.used)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) not in _codes(
                    nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_SUPPORTED"
                ):
                    raise
                self._say("memory-v1", f"v2 memory info unavailable ({exc}); using v1")
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), 0, int(info.used)

    def _call_newest(self, base: str, handle: Any) -> Sequence[Any]:
        nvml = self._nvml
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        for suffix in ("_v3", "_v2", ""):
            function = getattr(nvml, base + suffix, None)
            if function is None:
                continue
            try:
                return list(function(handle))
            except nvml.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", None):
                    continue
                if code == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", None):
                    raise _Refused(
                        "the driver does not report per-process GPU memory (not supported)"
                    ) from exc
                if code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", None):
                    raise _Refused(
                        "no permission to read per-process GPU memory (MIG needs privileges)"
                    ) from exc
                raise _Refused(f"per-process GPU memory unreadable: {exc}") from exc
            except Exception as exc:
                if mismatch is not None and isinstance(exc, mismatch):
                    continue
                raise
        raise _Refused(f"this NVML has no {base}")

    def _processes(self, handle: Any) -> dict[int, int | None]:
        """pid -> used GPU memory (None: not available) over both lists."""
        merged: dict[int, int | None] = {}
        for base in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            for entry in self._call_newest(base, handle):
                pid = int(entry.pid)
                used = entry.usedGpuMemory
                value = None if used is None else int(used)
                if pid in merged:
                    # A process with both a compute and a graphics context is
                    # listed twice with the same total: keep one figure.
                    before = merged[pid]
                    merged[pid] = None if value is None or before is None else max(before, value)
                else:
                    merged[pid] = value
        return merged

    def _per_process_problem(
        self,
        gpu: _Gpu,
        found: dict[int, int | None] | str,
        total: int,
        used_with_reserve: int,
        owner: Mapping[int, str],
        candidates: Sequence[str],
        matched_somewhere: set[str],
    ) -> str | None:
        """Why per-process figures can't be used on this GPU, or None."""
        if gpu.name in self._broken:
            return self._broken[gpu.name]
        if isinstance(found, str):
            return found
        if any(value is None for value in found.values()):
            return "per-process GPU memory not available from the driver"
        values = [value for value in found.values() if value is not None]
        slack = max(64 << 20, total // 100)
        if (
            any(value > total or value < 0 for value in values)
            or sum(values) > used_with_reserve + slack
            or any(pid <= 0 or pid >= _PID_MAX for pid in found)
        ):
            self._broken[gpu.name] = (
                "per-process GPU figures are implausible (pynvml and driver mismatched?)"
            )
            return self._broken[gpu.name]
        unseen = [pid for pid in found if pid not in owner and not (self._proc / str(pid)).is_dir()]
        if unseen and any(b not in matched_somewhere for b in candidates):
            return (
                f"NVML reports pids this /proc cannot see ({len(unseen)}); "
                "yard runs in another pid namespace than NVML"
            )
        return None

    @staticmethod
    def _per_process(
        found: Mapping[int, int | None], owner: Mapping[int, str], candidates: Sequence[str]
    ) -> dict[str, BackendUsage]:
        held: dict[str, int] = dict.fromkeys(candidates, 0)
        holders: dict[str, list[int]] = {b: [] for b in candidates}
        for pid, value in found.items():
            backend = owner.get(pid)
            if backend in held and value is not None:
                held[backend] += value
                holders[backend].append(pid)
        return {
            b: BackendUsage(held_bytes=held[b], pids=tuple(sorted(holders[b]))) for b in candidates
        }

    def _by_delta(
        self,
        device: str,
        used: int,
        candidates: Sequence[str],
        roots: Mapping[str, int],
    ) -> dict[str, BackendUsage]:
        """Figures for ``candidates`` by device deltas. ``roots``: the live
        backends of this read (root pid in /proc); a candidate not in it has
        exited."""
        state = self._deltas.get(device)
        alive = {b: roots[b] for b in candidates if b in roots}
        if state is None:
            # Entering the fallback: backends already running keep the last
            # per-process figures we had for them. One we never measured is
            # credited with growth from now on (it was there before we could
            # measure: what it holds already shows as foreign).
            last = self._last_per_process.get(device, {})
            frozen = {b: last[b] for b in alive if b in last}
            unmeasured = sorted(b for b in alive if b not in last)
            frozen.update(dict.fromkeys(unmeasured[1:], 0))
            state = _DeltaState(
                last_used=used,
                unattributed=max(0, used - sum(frozen.values())),
                known=dict(alive),
                frozen=frozen,
                latest=unmeasured[0] if unmeasured else None,
            )
            self._deltas[device] = state
        gone = [
            b
            for b, pid in state.known.items()
            if alive.get(b, pid) != pid
            or (b in candidates and b not in alive)
            or (b not in candidates and not (self._proc / str(pid)).is_dir())
        ]
        for backend in gone:
            del state.known[backend]
            state.frozen.pop(backend, None)
            if state.latest == backend:
                state.latest = None
        arrived = sorted(b for b in alive if b not in state.known)
        if arrived:
            if state.latest is not None:
                state.frozen[state.latest] = self._latest_figure(state, state.last_used)
            # Everything on the device just before the newcomer that no
            # backend holds is somebody else's.
            state.unattributed = max(0, state.last_used - sum(state.frozen.values()))
            # Two arriving in one interval cannot be told apart: the first
            # is credited with the growth, the others with nothing.
            state.latest = arrived[0]
            for other in arrived[1:]:
                state.frozen[other] = 0
            state.known.update((b, alive[b]) for b in arrived)
        state.last_used = used
        figures = dict(state.frozen)
        if state.latest is not None:
            figures[state.latest] = self._latest_figure(state, used)
        return {b: BackendUsage(held_bytes=figures.get(b, 0)) for b in candidates}

    @staticmethod
    def _latest_figure(state: _DeltaState, used: int) -> int:
        others = sum(v for b, v in state.frozen.items() if b != state.latest)
        return max(0, used - state.unattributed - others)

    def _visible_gpus(self, pids: Mapping[str, int]) -> dict[str, set[str]]:
        """GPUs each backend can use per its ``CUDA_VISIBLE_DEVICES``; backends
        without a usable setting are absent (they may use any)."""
        by_index = {str(gpu.index): gpu.name for gpu in self._gpus}
        proc_roots = self._pid_space.to_proc(pids)
        visible: dict[str, set[str]] = {}
        for backend, root in proc_roots.items():
            env = procfs.read_environ(root, proc=self._proc)
            if env is None or "CUDA_VISIBLE_DEVICES" not in env:
                continue
            tokens = [t.strip() for t in env["CUDA_VISIBLE_DEVICES"].split(",") if t.strip()]
            # CUDA numbers GPUs fastest-first unless told PCI order; NVML
            # numbers them in PCI order. Trust numbers only when they agree.
            numbers_agree = env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" or len(self._gpus) == 1
            names: set[str] = set()
            usable = True
            for token in tokens:
                if token.isdigit() and numbers_agree:
                    if token in by_index:
                        names.add(by_index[token])
                elif token.startswith(("GPU-", "MIG-")):
                    names.update(g.name for g in self._gpus if g.uuid.startswith(token))
                elif token == "-1" or token.startswith("NoDevFiles"):
                    break
                else:
                    usable = False
            if usable:
                visible[backend] = names
        return visible

    def _say(self, key: str, message: str) -> None:
        if (key, message) not in self._said:
            self._said.add((key, message))
            log.warning("%s: %s", key, message)


def _codes(nvml: Any, *names: str) -> set[object]:
    return {getattr(nvml, name) for name in names if hasattr(nvml, name)}


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)

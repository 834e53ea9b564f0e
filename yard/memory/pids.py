"""Translating pids between yard's pid namespace and the one ``/proc`` shows.

yard knows its backends by the pid its supervisor got from the kernel: a pid
in yard's own namespace. ``/proc`` may have been mounted by an outer namespace
(``unshare --pid --fork`` without ``--mount-proc``, some container set-ups),
and NVML always reports pids of the outermost namespace it can see. Each
``/proc/PID/status`` carries the chain of a process's pids (``NSpid``), from
the namespace of the ``/proc`` mount down to its own; comparing it with our
own chain maps one space onto the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from yard.memory import procfs


class PidSpace:
    """Maps pids as yard knows them to the pids of ``/proc`` (and NVML).

    ``proc`` is the procfs root; tests pass a fake one with a ``self`` entry.
    """

    def __init__(self, *, proc: Path = procfs.PROC) -> None:
        self._proc = proc
        # /proc/self is whoever reads it: its NSpid chain runs from the
        # namespace of the /proc mount down to ours, so its length says how
        # deep we sit below the pids /proc shows (1: no translation needed).
        try:
            text = (proc / "self" / "status").read_text()
        except OSError:
            text = ""
        fields = dict(
            (key.strip(), value.strip())
            for key, sep, value in (line.partition(":") for line in text.splitlines())
            if sep
        )
        self.depth = max(1, len(procfs.ns_pids(fields)))

    @property
    def translated(self) -> bool:
        """True when yard's pids differ from the pids ``/proc`` shows."""
        return self.depth > 1

    def to_proc(self, pids: Mapping[str, int]) -> dict[str, int]:
        """Each backend's root pid as ``/proc`` names it; backends whose
        process cannot be found are left out."""
        if not self.translated:
            return dict(pids)
        wanted = {pid: backend for backend, pid in pids.items()}
        found: dict[str, int] = {}
        for proc_pid in procfs.all_pids(proc=self._proc):
            fields = procfs.read_status(proc_pid, proc=self._proc)
            if fields is None:
                continue
            chain = procfs.ns_pids(fields)
            # A process in our namespace (or below) has our depth or more; its
            # pid as we know it sits at our depth.
            if len(chain) >= self.depth:
                backend = wanted.get(chain[self.depth - 1])
                if backend is not None:
                    found[backend] = proc_pid
        return found

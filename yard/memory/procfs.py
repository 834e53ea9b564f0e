"""Reading process trees and their memory from ``/proc``.

Rules this module keeps:

- A backend's memory is what its whole process tree holds: the root pid and
  every descendant, found by scanning the parent pid of every process (the
  kernel's ``/proc/PID/task/TID/children`` is not built into every kernel).
- What a tree *holds* is anonymous plus shared resident memory (``RssAnon +
  RssShmem``): the kernel cannot take it back without killing somebody.
  File-backed resident pages (``RssFile``: an mmap'd GGUF, shared libraries)
  are counted apart, as reclaimable: the kernel drops them under pressure and
  reads them again from disk.
- A process can exit between two reads; a vanished pid counts as nothing,
  never as an error.
- The ``/proc`` root is a parameter so that tests can hand in a fake tree
  (namespaced pids, processes that disappear).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
"""The real procfs."""

_KIB = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeMemory:
    """Resident host memory of one process tree at one moment.

    pids: the processes found (root first); empty if the root is gone.
    anon_bytes, shmem_bytes: anonymous and shared-memory resident pages.
    file_bytes: file-backed resident pages (mmap'd model files, libraries).
    """

    pids: tuple[int, ...] = ()
    anon_bytes: int = 0
    shmem_bytes: int = 0
    file_bytes: int = 0

    @property
    def held_bytes(self) -> int:
        """What the tree holds and the kernel cannot reclaim: anon + shmem."""
        return self.anon_bytes + self.shmem_bytes

    @property
    def reclaimable_bytes(self) -> int:
        """File-backed resident pages, which the kernel may drop and re-read."""
        return self.file_bytes


def read_status(pid: int, *, proc: Path = PROC) -> dict[str, str] | None:
    """The fields of ``/proc/PID/status`` as raw strings, or None if the
    process is gone (or was never there)."""
    try:
        text = (proc / str(pid) / "status").read_text()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _kib_field(fields: Mapping[str, str], key: str) -> int:
    """A ``"1234 kB"`` field in bytes; 0 when absent (kernel threads)."""
    raw = fields.get(key)
    if not raw:
        return 0
    number = raw.split()[0]
    return int(number) * _KIB if number.isdigit() else 0


def ns_pids(fields: Mapping[str, str]) -> tuple[int, ...]:
    """The ``NSpid`` chain: the pid in every pid namespace from the one that
    mounted this ``/proc`` (outermost, first) down to the process's own (last).
    A single entry means no nesting is visible."""
    raw = fields.get("NSpid") or fields.get("Pid") or ""
    return tuple(int(part) for part in raw.split() if part.isdigit())


def all_pids(*, proc: Path = PROC) -> list[int]:
    """Every pid visible in this ``/proc``."""
    try:
        names = os.listdir(proc)
    except FileNotFoundError:
        return []
    return [int(name) for name in names if name.isdigit()]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` that process trees and groups need.

    state: the state letter (``R``, ``S``, ``D``, ``Z`` zombie, ``X`` dead...).
    ppid: the parent's pid. pgid: the process group.
    """

    state: str
    ppid: int
    pgid: int

    @property
    def alive(self) -> bool:
        """Whether it still runs (a zombie has exited, only its entry is left)."""
        return self.state not in ("Z", "X")


def read_stat(pid: int, *, proc: Path = PROC) -> ProcStat | None:
    """State, parent and process group of ``pid``, or None if it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_bytes().decode(errors="replace")
    except OSError:  # gone (ENOENT, ESRCH), or never a process
        return None
    # The command name (field 2) is in parentheses and may itself contain
    # spaces and parentheses: parse from the last ")".
    rest = stat[stat.rfind(")") + 2 :].split()
    try:
        return ProcStat(state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]))
    except (IndexError, ValueError):
        return None


def _parent(pid: int, *, proc: Path) -> int | None:
    stat = read_stat(pid, proc=proc)
    return stat.ppid if stat is not None else None


def children_map(*, proc: Path = PROC) -> dict[int, list[int]]:
    """Parent pid -> its direct children, for every visible process."""
    children: dict[int, list[int]] = {}
    for pid in all_pids(proc=proc):
        parent = _parent(pid, proc=proc)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    return children


def process_tree(
    root: int, *, proc: Path = PROC, children: Mapping[int, list[int]] | None = None
) -> list[int]:
    """The root pid and all its descendants (root first), or ``[]`` if the
    root is gone. Pass ``children`` (from :func:`children_map`) to read
    several trees from one scan."""
    if not (proc / str(root)).is_dir():
        return []
    tree = children if children is not None else children_map(proc=proc)
    found = [root]
    seen = {root}
    index = 0
    while index < len(found):
        for child in sorted(tree.get(found[index], ())):
            if child not in seen:
                seen.add(child)
                found.append(child)
        index += 1
    return found


def tree_memory(pids: Iterable[int], *, proc: Path = PROC) -> TreeMemory:
    """Sum the resident memory of the given processes (a tree from
    :func:`process_tree`). Processes that have exited meanwhile count as 0."""
    anon = shmem = file = 0
    present: list[int] = []
    for pid in pids:
        fields = read_status(pid, proc=proc)
        if fields is None:
            continue
        present.append(pid)
        anon += _kib_field(fields, "RssAnon")
        shmem += _kib_field(fields, "RssShmem")
        file += _kib_field(fields, "RssFile")
    return TreeMemory(pids=tuple(present), anon_bytes=anon, shmem_bytes=shmem, file_bytes=file)


def read_environ(pid: int, *, proc: Path = PROC) -> dict[str, str] | None:
    """A process's environment at its start, or None if unreadable."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env

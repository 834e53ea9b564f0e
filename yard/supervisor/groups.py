"""Process groups: who is in one, signalling them, waiting until they are gone.

Every backend runs in a process group of its own (its leader's pid is the
group's number), so that one signal reaches the whole tree it started. The
members are read from ``/proc`` (:mod:`yard.memory.procfs`); zombies count as
gone. Off Linux the kernel can at least say whether a group exists.

Processes that are not yard's children give no event when they die, so the
waits here poll (every 20 ms).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Sequence

import psutil
import trio

from yard.memory.procfs import all_pids, read_stat

POLL_S = 0.02
"""How often :func:`wait_group_gone` looks again."""

_HAS_PROC = os.path.isdir("/proc/self")


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``."""
    if not _HAS_PROC:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []  # the usual case, without reading all of /proc
    except PermissionError:
        pass
    members = []
    for pid in all_pids():
        stat = read_stat(pid)
        if stat is not None and stat.pgid == pgid and stat.alive:
            members.append(pid)
    return members


def group_of(pid: int) -> int | None:
    """The process group of ``pid``, or None if it is gone."""
    stat = read_stat(pid)
    return stat.pgid if stat is not None else None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    stat = read_stat(pid)
    if stat is not None:
        return stat.alive
    if _HAS_PROC:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children...), whatever group."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or None if it is gone.
    With the pid it names one process: a pid may be reused, a start time not."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to every process of group ``pgid`` (nothing if it is gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_pids(pids: Iterable[int], sig: signal.Signals) -> None:
    """Send ``sig`` to each of ``pids`` (those gone are skipped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


async def wait_group_gone(pgid: int, extra: Sequence[int] = ()) -> None:
    """Return once no process of group ``pgid`` (nor any of ``extra``) lives.
    The caller bounds the wait."""
    while True:
        if not group_members(pgid) and not any(alive(pid) for pid in extra):
            return
        await trio.sleep(POLL_S)

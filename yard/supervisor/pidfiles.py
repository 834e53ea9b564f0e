"""Pid files: how a yard killed without cleaning up leaves no orphan for long.

``DATA_DIR/run/NAME.pid`` records each running backend group: its leader's
pid and start time, the group, the argv, and the yard that started it (pid
and start time). The file goes when the group is gone. The next yard kills
the groups whose files it finds (:func:`reap`), after checking that each pid
still belongs to the process recorded (same start time), so that a reused pid
of an unrelated process is never touched.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from yard.supervisor.groups import (
    descendants,
    group_members,
    signal_group,
    signal_pids,
    start_time,
    wait_group_gone,
)

SAME_START_S = 0.05
"""Two start times this close name the same process."""

REAP_WAIT_S = 10.0
"""How long :func:`reap` waits for a killed group to be gone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Orphan:
    """A backend process group left behind by an earlier yard.

    killed: whether its processes were killed (False: the pid file was stale,
        its pid now belongs to another process or to nobody).
    """

    backend: str
    pid: int
    pgid: int
    killed: bool
    detail: str


def write_pid_file(path: Path, backend: str, pid: int, argv: Sequence[str]) -> None:
    """Record the group led by ``pid`` (atomically: a reader never sees half)."""
    record = {
        "backend": backend,
        "pid": pid,
        "pgid": pid,
        "start_time": start_time(pid),
        "argv": list(argv),
        "yard_pid": os.getpid(),
        "yard_start_time": start_time(os.getpid()),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def read_pid_file(path: Path) -> dict[str, object] | None:
    """The record in ``path``, or None if it is missing or not a record."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def owner_alive(record: Mapping[str, object]) -> bool:
    """Whether the yard that wrote the record is another process still running."""
    owner, started = record.get("yard_pid"), record.get("yard_start_time")
    if not isinstance(owner, int) or not isinstance(started, int | float) or owner == os.getpid():
        return False
    now_started = start_time(owner)
    return now_started is not None and abs(now_started - float(started)) < SAME_START_S


async def reap(path: Path, record: Mapping[str, object] | None) -> Orphan | None:
    """Kill (SIGKILL) the group ``record`` (read from ``path``) names, if it
    is still what the record says, and wait until it is gone. None for a
    record that names no group."""
    if record is None:
        return None
    backend = str(record.get("backend", path.stem))
    pid, pgid, started = record.get("pid"), record.get("pgid"), record.get("start_time")
    if not isinstance(pid, int) or not isinstance(pgid, int) or pgid <= 1:
        return None
    now_started = start_time(pid)
    same = (
        isinstance(started, int | float)
        and now_started is not None
        and abs(now_started - float(started)) < SAME_START_S
    )
    if same:
        victims = [pid, *descendants(pid)]
    elif now_started is None and isinstance(started, int | float):
        # The leader is gone; its group may live on. A group number is a
        # leader's pid, so if no process holds that pid, nobody has taken
        # the number since, and every member started after the leader did
        # is what it left behind.
        victims = [
            p
            for p in group_members(pgid)
            if (t := start_time(p)) is not None and t >= float(started) - SAME_START_S
        ]
        if not victims:
            return Orphan(backend=backend, pid=pid, pgid=pgid, killed=False, detail="already gone")
    else:
        return Orphan(
            backend=backend,
            pid=pid,
            pgid=pgid,
            killed=False,
            detail=f"pid {pid} now belongs to another process; left alone",
        )
    signal_group(pgid, signal.SIGKILL)
    signal_pids(victims, signal.SIGKILL)
    with trio.move_on_after(REAP_WAIT_S):
        await wait_group_gone(pgid, victims)
    return Orphan(
        backend=backend,
        pid=pid,
        pgid=pgid,
        killed=True,
        detail=f"killed {backend} (pid {pid}, group {pgid}) left running by an earlier yard",
    )

"""One yard per data directory: a lock held for the process's lifetime.

Two yards on one data directory would restore each other's jobs, load a
second server for the same model (the double load yard exists to prevent)
and overwrite each other's pid files. So ``yard serve`` and ``yard probe``
take an exclusive ``flock`` on ``DATA_DIR/yard.lock`` before they touch
anything there, and keep it until they exit.

Rules this module keeps:

- The kernel releases the lock when the process ends, however it ends: a
  yard killed with SIGKILL never blocks the next start (there is no stale
  lock file to delete by hand; the file stays, the lock does not).
- The lock's descriptor is not inherited by the backends yard starts (Python
  opens files non-inheritable), so a backend left running by a killed yard
  does not hold it either.
- The holder writes who it is into the file (pid, command, listen address),
  so the refusal names the running yard: :class:`DataDirInUse`.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["LOCK_FILE", "DataDirInUse", "hold", "holder", "holder_pid"]

LOCK_FILE = "yard.lock"
"""The file in the data directory that carries the lock."""


class DataDirInUse(Exception):
    """Another process holds the data directory; the message names it."""


def holder_pid(data_dir: Path) -> int | None:
    """The pid of the process holding ``data_dir``, or None when nobody does."""
    if holder(data_dir) is None:
        return None
    try:
        record = json.loads((data_dir / LOCK_FILE).read_text())
        return int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def holder(data_dir: Path) -> str | None:
    """Who holds ``data_dir`` (for a message), or None when nobody does.

    Takes and drops the lock to find out; never blocks.
    """
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextmanager
def hold(data_dir: Path, *, command: str, listen: str | None = None) -> Iterator[None]:
    """Hold ``data_dir`` for the ``with`` block (creating it if needed).

    ``command`` (``"yard serve"``) and ``listen`` (``"127.0.0.1:8080"``) are
    written into the lock file for the message another yard will print.

    Raises :class:`DataDirInUse` at once (no waiting) when another process
    holds it, and ``OSError`` when the directory cannot be created or written.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _describe(fd)
            raise DataDirInUse(
                f"the data directory {data_dir} is in use by {who}; stop it first, or give "
                "this one another data directory (--data-dir or [server] data_dir)"
            ) from None
        record = {"pid": os.getpid(), "command": command, "listen": listen, "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
        yield
    finally:
        # Closing the descriptor releases the lock; the file stays (deleting
        # it would race with a yard that is opening it right now).
        os.close(fd)


def _describe(fd: int) -> str:
    """The holder as written in its lock file: ``yard serve (pid 123,
    listening on 127.0.0.1:8080)``."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict) or "pid" not in record:
        return "another yard (it has not said which yet)"
    what = str(record.get("command") or "yard")
    details = [f"pid {record['pid']}"]
    if record.get("listen"):
        details.append(f"listening on {record['listen']}")
    return f"{what} ({', '.join(details)})"

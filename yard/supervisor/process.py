"""One backend process: its readiness, its logs, its exit, its stop.

Rules :class:`ManagedProcess` keeps:

- Its stdout and stderr go to ``DATA_DIR/logs/NAME.log`` and to a ring of the
  last lines in memory (:meth:`ManagedProcess.log_lines`).
- Its exit is seen at once, with the exit status and the signs of running out
  of memory: a SIGKILL yard did not send (the kernel's OOM killer), or an
  out-of-memory message among its last log lines (:func:`looks_like_oom`).
- Stopping is SIGTERM to the group, SIGKILL after the grace period (at once
  once :meth:`Hurry.now` was called), and returns only once every process of
  the group is gone. When the group's leader exits on its own, what is left
  of its group is killed too, and its pid file goes.
"""

from __future__ import annotations

import collections
import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

import trio

from yard.config import BackendConfig
from yard.memory.warmup import FillProgress
from yard.ports import BackendStartError, ExitStatus, Took
from yard.supervisor.groups import (
    alive,
    descendants,
    group_members,
    group_of,
    signal_group,
    signal_pids,
    wait_group_gone,
)
from yard.supervisor.pidfiles import read_pid_file
from yard.supervisor.readiness import (
    EXIT_CHECK_S,
    WarmupFailed,
    fill_context,
    poll_health,
    read_took,
    warm_up,
)

LOOPBACK = "127.0.0.1"
"""Where every backend listens."""

OOM_SIGNS = (
    "out of memory",
    "outofmemoryerror",
    "std::bad_alloc",
    "memoryerror",
    "cudaerrormemoryallocation",
    "failed to allocate",
)
"""Substrings (lower case) of a log line that mean the process ran out of memory."""

OOM_LOOKBACK_LINES = 50
"""How many of the last log lines are searched for :data:`OOM_SIGNS`."""

MAX_LINE_BYTES = 64 * 1024
"""Longer output without a newline is cut into lines of this size in the ring."""

LOG_ROTATE_BYTES = 16 * 2**20
"""A backend log larger than this at start is moved to ``NAME.log.1``."""

DRAIN_WAIT_S = 0.5
"""After an exit, how long the last log lines may take to arrive."""

LEFTOVER_WAIT_S = 5.0
"""How long the rest of a group whose leader exited may take to die after SIGKILL."""


def looks_like_oom(lines: Iterable[str]) -> bool:
    """Whether any of ``lines`` reports running out of memory."""
    return any(sign in line.lower() for line in lines for sign in OOM_SIGNS)


def open_log(path: Path) -> IO[bytes]:
    """Open a backend's log for appending (moved aside first when it is
    over :data:`LOG_ROTATE_BYTES`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_ROTATE_BYTES:
            path.replace(path.with_name(path.name + ".1"))
    return path.open("ab")


class Hurry:
    """Whether stops still wait out their grace period; one for all the
    processes of a supervisor. :meth:`now` ends every grace in progress and
    every later one (a second signal to ``yard serve``)."""

    def __init__(self) -> None:
        self.hurried = False
        self._graces: set[trio.CancelScope] = set()

    @contextlib.contextmanager
    def grace(self, seconds: float) -> Iterator[trio.CancelScope]:
        """A scope that ends after ``seconds``, or at once when hurried."""
        with trio.move_on_after(0.0 if self.hurried else seconds) as scope:
            self._graces.add(scope)
            try:
                yield scope
            finally:
                self._graces.discard(scope)

    def now(self) -> None:
        """No more grace, from now on."""
        self.hurried = True
        for scope in list(self._graces):
            scope.cancel()


class ManagedProcess:
    """One running instance of a backend (a :class:`yard.ports.BackendProcess`).

    Built by :meth:`yard.supervisor.Supervisor.launch` once the process is
    spawned; the supervisor runs :meth:`read_stream` for stdout and stderr
    and :meth:`watch` for its life. ``on_exit`` is called once, when its exit
    status is known.
    """

    def __init__(
        self,
        *,
        config: BackendConfig,
        process: trio.Process,
        port: int,
        argv: Sequence[str],
        log: IO[bytes],
        ring: collections.deque[str],
        pid_file: Path,
        hurry: Hurry,
        on_exit: Callable[[ManagedProcess], None],
        fill_context: bool = False,
    ) -> None:
        self.config = config
        self._process = process
        self.port = port
        self.argv = tuple(argv)
        self._log = log
        self._ring = ring
        self._pid_file = pid_file
        self._hurry = hurry
        self._on_exit = on_exit
        self.fill_context = fill_context
        self.warmup: FillProgress | None = None
        """How far the context fill of a measured load is (None: none runs)."""
        self._ready = False
        self._took: Took | None = None
        # an out-of-memory line logged before it is ready: a server that
        # reports it and stays up (llama-server answering 503) is failed at once
        self._oom_line: str | None = None
        self._oom_seen = trio.Event()
        self._sent_sigkill = False
        self._stop_requested = False
        self._status: ExitStatus | None = None
        self._status_lock = trio.Lock()
        self._readers_done = 0
        self._drained = trio.Event()
        self.started_at = trio.current_time()

    # BackendProcess

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def took(self) -> Took | None:
        """What the server reported taking once ready (llama-server's
        ``/props``; None: nothing, or another server)."""
        return self._took

    @property
    def exit_status(self) -> ExitStatus | None:
        """How it ended, once it has (None while it runs)."""
        return self._status

    def log_lines(self) -> list[str]:
        """The last lines it wrote (stdout and stderr), oldest first."""
        return list(self._ring)

    def _warming(self, progress: FillProgress) -> None:
        self.warmup = progress

    def note(self, line: str) -> None:
        """Add a line of yard's own to its log and ring (``[yard] ...``)."""
        self._ring.append(line)
        self._write_log((line + "\n").encode())

    async def wait_ready(self) -> None:
        """Poll the health path until it answers 200, then run the warm-up
        request, then, on a measured load of a llama-server, fill a slot's
        context (:mod:`yard.supervisor.readiness`). Raises
        :class:`BackendStartError` as soon as the process exits, or if the
        warm-up fails. The caller bounds the wait."""
        if self._ready:
            return
        failure: str | None = None
        async with trio.open_nursery() as nursery:

            async def watch_exit() -> None:
                await self._process.wait()
                nursery.cancel_scope.cancel()

            async def watch_oom() -> None:
                nonlocal failure
                await self._oom_seen.wait()
                failure = f"{self.name} ran out of memory while starting: {self._oom_line}"
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_exit)
            nursery.start_soon(watch_oom)
            try:
                await poll_health(self.base_url, self.config.health_path)
                await warm_up(self.name, self.base_url, self.config.warmup)
                if self.fill_context:
                    await fill_context(
                        self.config, self.base_url, self._process, self.note, self._warming
                    )
                # llama-server's /props (any server may have one; others 404)
                self._took = await read_took(self.base_url)
                self._ready = True
            except WarmupFailed as exc:
                failure = str(exc)
            nursery.cancel_scope.cancel()
        if self._oom_line is not None and not self._ready:
            # It said so. Most servers exit next (their exit status tells);
            # one that stays up (health 503) is not waited for until its
            # start-up timeout: the caller stops it.
            with trio.move_on_after(EXIT_CHECK_S):
                await self._process.wait()
            if self._process.poll() is not None:
                status = await self.wait_exit()
                raise BackendStartError(
                    f"{self.name} exited before it was ready: {status.detail}", oom=True
                )
            self.note("[yard] out of memory reported while starting and still up; stopping it")
            raise BackendStartError(failure or f"{self.name}: {self._oom_line}", oom=True)
        if failure is not None:
            # A warm-up that broke off is usually a backend that died under it.
            with trio.move_on_after(EXIT_CHECK_S):
                await self._process.wait()
            if self._process.poll() is None:
                raise BackendStartError(failure)
        if not self._ready:
            status = await self.wait_exit()
            raise BackendStartError(
                f"{self.name} exited before it was ready: {status.detail}", oom=status.oom
            )

    async def wait_exit(self) -> ExitStatus:
        """Return when the process has exited (and what was left of its group
        was killed), however that happened."""
        await self._process.wait()
        async with self._status_lock:
            if self._status is None:
                # Let the log readers take in the last lines (the OOM message is
                # often the very last one); a child holding the pipes open must
                # not delay the report for long.
                with trio.move_on_after(DRAIN_WAIT_S):
                    await self._drained.wait()
                self._status = self._make_status()
                await self._clean_up_group()
                self._on_exit(self)
        return self._status

    async def stop(self) -> ExitStatus:
        """SIGTERM to the process group, SIGKILL after the backend's
        ``stop_grace_s`` (at once when hurried); return once every process of
        the group is gone."""
        self._stop_requested = True
        pgid = self._process.pid
        if self._process.poll() is None:
            # Descendants that moved to a group of their own are still ours:
            # they get the same signals, one by one.
            strays = [p for p in descendants(pgid) if group_of(p) not in (None, pgid)]
            signal_group(pgid, signal.SIGTERM)
            signal_pids(strays, signal.SIGTERM)
            with self._hurry.grace(self.config.stop_grace_s):
                await self._process.wait()
                await wait_group_gone(pgid, strays)
            if self._process.poll() is None or group_members(pgid):
                self._sent_sigkill = True
                self.note(f"[yard] no exit after SIGTERM; SIGKILL to group {pgid}")
                signal_group(pgid, signal.SIGKILL)
            signal_pids([p for p in strays if alive(p)], signal.SIGKILL)
            await self._process.wait()
            await wait_group_gone(pgid, strays)
        return await self.wait_exit()

    async def read_stream(self, stream: trio.abc.ReceiveStream) -> None:
        """Copy one of its output pipes to the log file and the ring, line by
        line, until the pipe closes."""
        buffer = b""
        try:
            async for chunk in stream:
                self._write_log(chunk)
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                if len(buffer) > MAX_LINE_BYTES:
                    # A progress bar without newlines must not grow without end.
                    lines.append(buffer)
                    buffer = b""
                text = [line.decode(errors="replace").rstrip("\r") for line in lines]
                self._ring.extend(text)
                if not self._ready and self._oom_line is None:
                    self._oom_line = next((t for t in text if looks_like_oom([t])), None)
                    if self._oom_line is not None:
                        self._oom_seen.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if buffer:
                self._ring.append(buffer.decode(errors="replace"))
            self._readers_done += 1
            if self._readers_done == 2:
                self._drained.set()

    async def watch(self) -> None:
        """Runs for the life of the process: records its exit as soon as it
        happens, and closes its log."""
        try:
            status = await self.wait_exit()
            self.note(f"[yard] {status.detail}")
        finally:
            with contextlib.suppress(OSError):
                self._log.close()

    # internals

    def _make_status(self) -> ExitStatus:
        code = self._process.returncode
        tail = list(self._ring)[-OOM_LOOKBACK_LINES:]
        oom_in_log = looks_like_oom(tail)
        killed_by_other = code == -signal.SIGKILL and not self._sent_sigkill
        oom = oom_in_log or killed_by_other
        if code is None:
            what = "exit status unknown"
        elif code < 0:
            try:
                what = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                what = f"killed by signal {-code}"
            if killed_by_other:
                what += " (not sent by yard: likely the kernel's out-of-memory killer)"
        else:
            what = f"exited with code {code}"
        if self._stop_requested:
            what += " after yard asked it to stop"
        if oom_in_log:
            what += "; its log reports out of memory"
        last = [line for line in tail if line.strip()][-5:]
        detail = f"{self.name} {what}"
        if last and not self._stop_requested:
            detail += "; last log lines: " + " | ".join(last)
        return ExitStatus(code=code, oom=oom, detail=detail)

    async def _clean_up_group(self) -> None:
        pgid = self._process.pid
        if group_members(pgid):
            # The leader is gone; what is left of its group is of no use and
            # holds memory.
            signal_group(pgid, signal.SIGKILL)
            with trio.move_on_after(LEFTOVER_WAIT_S):
                await wait_group_gone(pgid)
        if not group_members(pgid):
            # Gone for good: nothing for a later yard to reap.
            with contextlib.suppress(OSError):
                if (read_pid_file(self._pid_file) or {}).get("pid") == pgid:
                    self._pid_file.unlink()

    def _write_log(self, data: bytes | bytearray) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._log.write(data)
            self._log.flush()

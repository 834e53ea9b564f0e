"""Real backend processes: start, health check, logs, exit watch, stop.

:class:`Supervisor` is the real :class:`yard.ports.Launcher`. Rules it keeps:

- A backend is started from its argv, never through a shell, in a process
  group of its own (``start_new_session``), on a free loopback port, with
  ``CUDA_VISIBLE_DEVICES`` set to the GPUs it was placed on (empty for a
  host-only backend, so that it cannot take GPU memory yard does not count),
  and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (unless its ``env`` says otherwise), so
  that CUDA numbers the GPUs as NVML does: ``gpu1`` is CUDA device 1.
- It is ready when its health path answers 200 (a 503 "Loading model" is not
  ready) and its warm-up request, if any, succeeded. On a measured first
  load (``launch(..., measure=True)``) of a llama-server backend (see
  :func:`fills_context`) one more request fills a slot's whole context
  before it is ready, so that the profile taken during the load is the
  worst case, not the footprint of an idle server.
- Its stdout and stderr go to ``DATA_DIR/logs/NAME.log`` and to a ring of the
  last lines in memory (:meth:`Supervisor.log_lines`).
- Its exit is seen at once, with the exit status and the signs of running out
  of memory: a SIGKILL yard did not send (the kernel's OOM killer), or an
  out-of-memory message among its last log lines.
- Stopping is SIGTERM to the group, SIGKILL after the grace period, and
  returns only once every process of the group is gone. When the group's
  leader exits on its own, what is left of its group is killed too.
- Never an orphan: ``DATA_DIR/run/NAME.pid`` records each running group
  (pid, pgid, start time). A yard killed without cleaning up leaves these
  files; the next one kills those groups at start-up
  (:meth:`Supervisor.reap_orphans`), after checking that each pid still
  belongs to the process it started (same start time), so a reused pid of an
  unrelated process is never touched. A second process that shares the
  data directory without owning its backends (``yard probe``) passes
  ``reap_orphans=False``.
- The supervisor never restarts a backend by itself: the core decides.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import psutil
import trio

from yard.config import BackendConfig, Config
from yard.memory.gpus import visible_devices_env
from yard.memory.warmup import fill_llama_context, looks_like_llama_server
from yard.ports import BackendStartError, ExitStatus

__all__ = [
    "OOM_SIGNS",
    "Orphan",
    "Supervisor",
    "SupervisorStatistics",
    "fills_context",
    "looks_like_oom",
]

LOOPBACK = "127.0.0.1"

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


def looks_like_oom(lines: Iterable[str]) -> bool:
    """Whether any of ``lines`` reports running out of memory."""
    return any(sign in line.lower() for line in lines for sign in OOM_SIGNS)


def fills_context(backend: BackendConfig, argv: Sequence[str], *, measure: bool) -> bool:
    """Whether a launch of ``backend`` as ``argv`` gets
    :func:`yard.memory.warmup.fill_llama_context` after its warm-up: only a
    measured load, and then as ``warmup.fill_context`` says (``"auto"``: when
    ``argv`` looks like llama-server)."""
    if not measure:
        return False
    if backend.fill_context == "auto":
        return looks_like_llama_server(argv)
    return backend.fill_context


# -- process groups -------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of ``pid`` from /proc, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[2])
    except (IndexError, ValueError):
        return None


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``."""
    if not os.path.isdir("/proc/self"):
        # Not Linux: the kernel can at least say whether the group exists.
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
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_pids(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


async def _wait_group_gone(pgid: int, extra: Sequence[int] = ()) -> None:
    """Return once no process of group ``pgid`` (nor any of ``extra``) lives."""
    # Processes that are not our children give no event when they die: poll.
    while True:
        if not group_members(pgid) and not any(_alive(pid) for pid in extra):
            return
        await trio.sleep(0.02)


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    if stat is not None:
        return stat[0] not in ("Z", "X")
    if os.path.isdir("/proc/self"):
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _free_port() -> int:
    """A loopback port nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


# -- pid files --------------------------------------------------------------------


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


def _write_pid_file(path: Path, backend: str, pid: int, argv: Sequence[str]) -> None:
    record = {
        "backend": backend,
        "pid": pid,
        "pgid": pid,
        "start_time": _start_time(pid),
        "argv": list(argv),
        "yard_pid": os.getpid(),
        "yard_start_time": _start_time(os.getpid()),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def _read_pid_file(path: Path) -> dict[str, object] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _open_log(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_ROTATE_BYTES:
            path.replace(path.with_name(path.name + ".1"))
    return path.open("ab")


def _owner_alive(record: Mapping[str, object]) -> bool:
    """Whether the yard that wrote the pid file is another process still running."""
    owner, started = record.get("yard_pid"), record.get("yard_start_time")
    if not isinstance(owner, int) or not isinstance(started, int | float) or owner == os.getpid():
        return False
    now_started = _start_time(owner)
    return now_started is not None and abs(now_started - float(started)) < 0.05


# -- one process ------------------------------------------------------------------


class ManagedProcess:
    """One running instance of a backend (a :class:`yard.ports.BackendProcess`)."""

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        config: BackendConfig,
        process: trio.Process,
        port: int,
        argv: Sequence[str],
        log: IO[bytes],
        ring: collections.deque[str],
        pid_file: Path,
        fill_context: bool = False,
    ) -> None:
        self._supervisor = supervisor
        self.config = config
        self._process = process
        self.port = port
        self.argv = tuple(argv)
        self._log = log
        self._ring = ring
        self._pid_file = pid_file
        self.fill_context = fill_context
        self._ready = False
        self._sent_sigkill = False
        self._stop_requested = False
        self._status: ExitStatus | None = None
        self._status_lock = trio.Lock()
        self._readers_done = 0
        self._drained = trio.Event()
        self._exited = trio.Event()
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
    def exit_status(self) -> ExitStatus | None:
        """How it ended, once it has (None while it runs)."""
        return self._status

    def log_lines(self) -> list[str]:
        """The last lines it wrote (stdout and stderr), oldest first."""
        return list(self._ring)

    async def wait_ready(self) -> None:
        """Poll the health path (every ~100 ms) until it answers 200, then run
        the warm-up request, then, on a measured load of a llama-server, fill
        a slot's context (:func:`fills_context`). Raises :class:`BackendStartError` as soon as the
        process exits, or if the warm-up fails. The caller bounds the wait."""
        if self._ready:
            return
        failure: str | None = None
        async with trio.open_nursery() as nursery:

            async def watch_exit() -> None:
                await self._process.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_exit)
            try:
                await self._poll_health()
                await self._warm_up()
                if self.fill_context:
                    await self._fill_context()
                self._ready = True
            except _WarmupFailed as exc:
                failure = str(exc)
            nursery.cancel_scope.cancel()
        if failure is not None:
            # A warm-up that broke off is usually a backend that died under it.
            with trio.move_on_after(1.0):
                await self._process.wait()
            if self._process.poll() is None:
                raise BackendStartError(failure)
        if not self._ready:
            status = await self.wait_exit()
            raise BackendStartError(
                f"{self.name} exited before it was ready: {status.detail}", oom=status.oom
            )

    async def _poll_health(self) -> None:
        async with httpx.AsyncClient(
            base_url=self.base_url, trust_env=False, timeout=httpx.Timeout(5.0)
        ) as client:
            while True:
                # One attempt may not hang the loop: a backend that accepts and
                # never answers is polled again (the caller's timeout ends it).
                with trio.move_on_after(2.0):
                    try:
                        response = await client.get(self.config.health_path)
                    except httpx.HTTPError:
                        pass
                    else:
                        if response.status_code == 200:
                            return
                await trio.sleep(0.1)

    async def _warm_up(self) -> None:
        warmup = self.config.warmup
        if warmup is None:
            return
        async with httpx.AsyncClient(
            base_url=self.base_url, trust_env=False, timeout=httpx.Timeout(None)
        ) as client:
            try:
                response = await client.request(
                    warmup.method,
                    warmup.path,
                    json=warmup.json if warmup.json is not None else None,
                )
            except httpx.HTTPError as exc:
                raise _WarmupFailed(f"{self.name}: warm-up {warmup.path} failed: {exc!r}") from exc
            if not 200 <= response.status_code < 300:
                raise _WarmupFailed(
                    f"{self.name}: warm-up {warmup.method} {warmup.path} answered "
                    f"{response.status_code}: {response.text[:300]}"
                )

    async def _fill_context(self) -> None:
        self._supervisor._log_line(
            self, "[yard] measured first load: filling a slot's context (the worst case)"
        )
        try:
            await fill_llama_context(self.base_url)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            if self.config.fill_context is True:
                raise _WarmupFailed(f"{self.name}: context fill failed: {exc!r}") from exc
            # "auto" guessed from the command: a server without /props or
            # /tokenize still starts, with a profile that may be short of the
            # worst case. One that died under the fill is reported as dead.
            with trio.move_on_after(1.0):
                await self._process.wait()
            if self._process.poll() is not None:
                raise _WarmupFailed(f"{self.name}: exited during the context fill") from exc
            self._supervisor._log_line(
                self,
                f"[yard] context fill failed ({exc!r}); the measured profile may be short "
                "of the worst case (set warmup.fill_context = false to skip it)",
            )
        else:
            self._supervisor._log_line(self, "[yard] context filled")

    async def wait_exit(self) -> ExitStatus:
        """Return when the process has exited (and what was left of its group
        was killed), however that happened."""
        await self._process.wait()
        async with self._status_lock:
            if self._status is None:
                # Let the log readers take in the last lines (the OOM message is
                # often the very last one); a child holding the pipes open must
                # not delay the report for long.
                with trio.move_on_after(0.5):
                    await self._drained.wait()
                self._status = self._make_status()
                await self._clean_up_group()
                self._supervisor._exited(self)
                self._exited.set()
        return self._status

    async def stop(self) -> ExitStatus:
        """SIGTERM to the process group, SIGKILL after the backend's
        ``stop_grace_s`` (at once after :meth:`Supervisor.hurry`); return once
        every process of the group is gone."""
        self._stop_requested = True
        pgid = self._process.pid
        if self._process.poll() is None:
            # Descendants that moved to a group of their own are still ours:
            # they get the same signals, one by one.
            strays = [p for p in _descendants(pgid) if (_proc_stat(p) or ("", pgid))[1] != pgid]
            _signal_group(pgid, signal.SIGTERM)
            _signal_pids(strays, signal.SIGTERM)
            with trio.move_on_after(self._supervisor.grace_for(self)) as grace:
                self._supervisor._graces.add(grace)
                try:
                    await self._process.wait()
                    await _wait_group_gone(pgid, strays)
                finally:
                    self._supervisor._graces.discard(grace)
            if self._process.poll() is None or group_members(pgid):
                self._sent_sigkill = True
                self._supervisor._log_line(
                    self, f"[yard] no exit after SIGTERM; SIGKILL to group {pgid}"
                )
                _signal_group(pgid, signal.SIGKILL)
            _signal_pids([p for p in strays if _alive(p)], signal.SIGKILL)
            await self._process.wait()
            await _wait_group_gone(pgid, strays)
        return await self.wait_exit()

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
            _signal_group(pgid, signal.SIGKILL)
            with trio.move_on_after(5.0):
                await _wait_group_gone(pgid)
        if not group_members(pgid):
            # Gone for good: nothing for a later yard to reap.
            with contextlib.suppress(OSError):
                if (_read_pid_file(self._pid_file) or {}).get("pid") == pgid:
                    self._pid_file.unlink()

    async def _read_stream(self, stream: trio.abc.ReceiveStream) -> None:
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
                self._ring.extend(line.decode(errors="replace").rstrip("\r") for line in lines)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if buffer:
                self._ring.append(buffer.decode(errors="replace"))
            self._readers_done += 1
            if self._readers_done == 2:
                self._drained.set()

    def _write_log(self, data: bytes | bytearray) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._log.write(data)
            self._log.flush()

    async def _watch(self) -> None:
        """Runs for the life of the process: records its exit as soon as it
        happens, and closes its log."""
        try:
            status = await self.wait_exit()
            self._supervisor._log_line(self, f"[yard] {status.detail}")
        finally:
            with contextlib.suppress(OSError):
                self._log.close()


class _WarmupFailed(Exception):
    pass


# -- the supervisor -----------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorStatistics:
    """What the supervisor has done since it started."""

    running: tuple[str, ...]
    launches: int
    exits: int
    oom_exits: int
    orphans_reaped: int


class Supervisor:
    """Starts and stops backend processes (the real :class:`yard.ports.Launcher`).

    Usage::

        supervisor = Supervisor(config)
        await nursery.start(supervisor.run)      # reaps orphans, then ready
        process = await supervisor.launch("llm", ("gpu0",))
        with trio.fail_after(60):
            await process.wait_ready()
        ...
        await process.stop()

    When :meth:`run` is cancelled every backend still running is stopped
    (shielded, each within its grace period).

    reap_orphans: whether :meth:`run` first kills the backends an earlier
    yard left running (see :meth:`reap_orphans`). A second process sharing
    the data directory that does not own its backends (``yard probe``)
    passes False.
    """

    def __init__(self, config: Config, *, log_lines: int = 500, reap_orphans: bool = True) -> None:
        self.config = config
        self._reap_at_start = reap_orphans
        self._data_dir = config.server.data_dir
        self._log_dir = self._data_dir / "logs"
        self._run_dir = self._data_dir / "run"
        self._ring_size = log_lines
        self._rings: dict[str, collections.deque[str]] = {}
        self._processes: dict[str, ManagedProcess] = {}
        self._nursery: trio.Nursery | None = None
        self._launches = 0
        self._exits = 0
        self._oom_exits = 0
        self._orphans_reaped = 0
        # Shutting down: no new launch, and (hurried) no more grace.
        self._closing = False
        self._hurried = False
        self._graces: set[trio.CancelScope] = set()
        # Launches whose process is being spawned (stop_all waits for them).
        self._spawning = 0
        self._spawned = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reap orphans of an earlier yard (unless constructed with
        ``reap_orphans=False``), then serve launches until cancelled; on the
        way out, stop every backend still running."""
        if self._reap_at_start:
            # Shielded: a yard stopped while it starts still kills what an
            # earlier one left behind (that is quick: SIGKILL, no grace).
            with trio.CancelScope(shield=True):
                await self.reap_orphans()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._closing = True
            with trio.CancelScope(shield=True):
                await self.stop_all()

    async def stop_all(self) -> None:
        """Stop every running backend, concurrently, and return once every
        process group is gone: also those of launches still spawning (a
        launch that ends after :meth:`run` did kills its own process)."""
        while self._spawning:
            await self._spawned.wait()
        async with trio.open_nursery() as nursery:
            for process in list(self._processes.values()):
                if process.exit_status is None:
                    nursery.start_soon(process.stop)

    def hurry(self) -> None:
        """Skip the grace period: every stop in progress, and every later
        one, sends SIGKILL to its group now (a second Ctrl-C or SIGTERM to
        ``yard serve``). Stops still return only once the group is gone."""
        self._hurried = True
        for grace in list(self._graces):
            grace.cancel()

    def grace_for(self, process: ManagedProcess) -> float:
        """How long a stop of ``process`` waits after SIGTERM: its
        ``stop_grace_s``, or nothing once hurried."""
        return 0.0 if self._hurried else process.config.stop_grace_s

    def running(self) -> dict[str, ManagedProcess]:
        """The backends whose process has not exited, by name."""
        return {n: p for n, p in self._processes.items() if p.exit_status is None}

    def log_lines(self, backend: str) -> list[str]:
        """The last lines the backend wrote (across restarts), oldest first."""
        return list(self._rings.get(backend, ()))

    backend_log = log_lines  # the name the engine looks for

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            running=tuple(sorted(self.running())),
            launches=self._launches,
            exits=self._exits,
            oom_exits=self._oom_exits,
            orphans_reaped=self._orphans_reaped,
        )

    def command_for(self, backend: BackendConfig, port: int, gpus: tuple[str, ...]) -> list[str]:
        """The backend's argv with every placeholder filled in."""
        values = self._placeholders(backend, port, gpus)
        return [arg.format_map(values) for arg in backend.command]

    def _placeholders(
        self, backend: BackendConfig, port: int, gpus: tuple[str, ...]
    ) -> dict[str, str]:
        return {
            "port": str(port),
            "host": LOOPBACK,
            "model": backend.models[0] if backend.models else backend.name,
            "model_file": str(backend.model_file or ""),
            "gpus": backend.gpu_indices(gpus),
            "data_dir": str(self._data_dir),
            "config_dir": str(self.config.config_dir),
            "python": sys.executable,
        }

    async def launch(
        self, backend: str, gpus: tuple[str, ...], *, measure: bool = False
    ) -> ManagedProcess:
        """Start ``backend`` placed on ``gpus`` and return at once (not ready
        yet; see :meth:`ManagedProcess.wait_ready`). ``measure``: this is a
        measured first load; a llama-server backend then gets its context
        filled before it is ready (:func:`fills_context`).

        Raises :class:`BackendStartError` if it is unknown, still running, or
        cannot be spawned (command not found, not executable, bad cwd).
        """
        if self._closing:
            raise BackendStartError(f"{backend}: not started, yard is shutting down")
        if self._nursery is None:
            raise RuntimeError("Supervisor.run() must be started before launch()")
        config = self.config.backends.get(backend)
        if config is None:
            raise BackendStartError(f"no backend called {backend!r} in {self.config.path}")
        previous = self._processes.get(backend)
        if previous is not None and previous.exit_status is None:
            raise BackendStartError(f"{backend} is already running (pid {previous.pid})")
        port = _free_port()
        values = self._placeholders(config, port, gpus)
        argv = [arg.format_map(values) for arg in config.command]
        env = dict(os.environ)
        # CUDA numbers GPUs fastest first by default, NVML (and so gpuN) by
        # PCI bus: make them agree, whatever yard itself inherited, unless the
        # backend's own env says otherwise.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env.update({k: v.format_map(values) for k, v in config.env.items()})
        # Placement decides which GPUs it sees, for every vendor's runtime
        # (CUDA, ROCm, Level Zero); a host-only backend sees none. YARD_GPUS
        # tells the host meter a CPU backend's mmap'd weights are held.
        env.update(visible_devices_env(gpus))
        env["PYTHONUNBUFFERED"] = env.get("PYTHONUNBUFFERED", "1")
        cwd = config.cwd or self.config.config_dir
        ring = self._rings.setdefault(backend, collections.deque(maxlen=self._ring_size))
        log = _open_log(self._log_dir / f"{backend}.log")
        header = f"[yard] starting {backend} on port {port}, gpus {list(gpus)}: {argv}"
        log.write((header + "\n").encode())
        log.flush()
        ring.append(header)
        self._spawning += 1
        try:
            process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=env,
                cwd=str(cwd),
            )
        except OSError as exc:
            self._spawn_done()
            message = f"cannot start {backend}: {argv[0]}: {exc.strerror or exc}"
            log.write(f"[yard] {message}\n".encode())
            log.close()
            ring.append(f"[yard] {message}")
            raise BackendStartError(message) from exc
        if self._nursery is None:
            # The supervisor stopped while the process was being spawned (the
            # spawn cannot be cancelled): nobody would ever stop this one.
            with trio.CancelScope(shield=True):
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
                with trio.move_on_after(5.0):
                    await _wait_group_gone(process.pid)
            self._spawn_done()
            log.write(b"[yard] killed at once: yard is shutting down\n")
            log.close()
            raise BackendStartError(f"{backend}: not started, yard is shutting down")
        self._spawn_done()
        self._run_dir.mkdir(parents=True, exist_ok=True)
        pid_file = self._run_dir / f"{backend}.pid"
        _write_pid_file(pid_file, backend, process.pid, argv)
        managed = ManagedProcess(
            supervisor=self,
            config=config,
            process=process,
            port=port,
            argv=argv,
            log=log,
            ring=ring,
            pid_file=pid_file,
            fill_context=fills_context(config, argv, measure=measure),
        )
        self._processes[backend] = managed
        self._launches += 1
        assert process.stdout is not None and process.stderr is not None
        self._nursery.start_soon(managed._read_stream, process.stdout)
        self._nursery.start_soon(managed._read_stream, process.stderr)
        self._nursery.start_soon(managed._watch)
        return managed

    def _spawn_done(self) -> None:
        self._spawning -= 1
        if not self._spawning:
            self._spawned.set()
            self._spawned = trio.Event()

    async def reap_orphans(self) -> list[Orphan]:
        """Kill the backend process groups an earlier yard left running (found
        through its pid files), and remove the pid files.

        A pid file whose pid now belongs to a different process (its start
        time differs) is stale: that process is left alone. If the recorded
        leader is gone but members of its group live on, they are killed only
        when no process has taken the group's number since. Backends this
        supervisor runs, and backends of another yard that is still running
        (same data directory), are not orphans: they and their pid files are
        left alone.
        """
        orphans: list[Orphan] = []
        if not self._run_dir.is_dir():
            return orphans
        mine = {p.pid for p in self.running().values()}
        for path in sorted(self._run_dir.glob("*.pid")):
            record = _read_pid_file(path)
            if record is not None and (record.get("pid") in mine or _owner_alive(record)):
                continue
            orphan = await self._reap(path, record)
            if orphan is not None:
                orphans.append(orphan)
                if orphan.killed:
                    self._orphans_reaped += 1
                    ring = self._rings.setdefault(
                        orphan.backend, collections.deque(maxlen=self._ring_size)
                    )
                    ring.append(f"[yard] {orphan.detail}")
            with contextlib.suppress(OSError):
                path.unlink()
        return orphans

    async def _reap(self, path: Path, record: dict[str, object] | None) -> Orphan | None:
        if record is None:
            return None
        backend = str(record.get("backend", path.stem))
        pid, pgid, started = record.get("pid"), record.get("pgid"), record.get("start_time")
        if not isinstance(pid, int) or not isinstance(pgid, int) or pgid <= 1:
            return None
        now_started = _start_time(pid)
        same = (
            isinstance(started, int | float)
            and now_started is not None
            and abs(now_started - float(started)) < 0.05
        )
        if same:
            victims = [pid, *_descendants(pid)]
        elif now_started is None and isinstance(started, int | float):
            # The leader is gone; its group may live on. A group number is a
            # leader's pid, so if no process holds that pid, nobody has taken
            # the number since, and every member started after the leader did
            # is what it left behind.
            victims = [
                p
                for p in group_members(pgid)
                if (t := _start_time(p)) is not None and t >= float(started) - 0.05
            ]
            if not victims:
                return Orphan(
                    backend=backend, pid=pid, pgid=pgid, killed=False, detail="already gone"
                )
        else:
            return Orphan(
                backend=backend,
                pid=pid,
                pgid=pgid,
                killed=False,
                detail=f"pid {pid} now belongs to another process; left alone",
            )
        _signal_group(pgid, signal.SIGKILL)
        _signal_pids(victims, signal.SIGKILL)
        with trio.move_on_after(10.0):
            await _wait_group_gone(pgid, victims)
        return Orphan(
            backend=backend,
            pid=pid,
            pgid=pgid,
            killed=True,
            detail=f"killed {backend} (pid {pid}, group {pgid}) left running by an earlier yard",
        )

    # called by ManagedProcess

    def _exited(self, process: ManagedProcess) -> None:
        self._exits += 1
        if process.exit_status is not None and process.exit_status.oom:
            self._oom_exits += 1

    def _log_line(self, process: ManagedProcess, line: str) -> None:
        process._ring.append(line)
        process._write_log((line + "\n").encode())

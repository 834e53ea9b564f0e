"""The supervisor: the real :class:`yard.ports.Launcher`.

Rules it keeps:

- A backend is started from its argv, never through a shell, in a process
  group of its own (``start_new_session``), on a free loopback port, seeing
  only the GPUs it was placed on (:func:`yard.memory.gpus.visible_devices_env`:
  none for a host-only backend, so that it cannot take GPU memory yard does
  not count), with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (unless its ``env`` says otherwise), so
  that CUDA numbers the GPUs as NVML does: ``gpu1`` is CUDA device 1.
- Never an orphan: every running group has a pid file
  (:mod:`yard.supervisor.pidfiles`); at start-up the groups an earlier yard
  left behind are killed (:meth:`Supervisor.reap_orphans`). A second process
  that shares the data directory without owning its backends (``yard
  probe``) passes ``reap_orphans=False``. On the way out every backend is
  stopped, also one whose spawn was still under way.
- The supervisor never restarts a backend by itself: the core decides.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

import trio

from yard.config import BackendConfig, Config, programs
from yard.memory.gpus import visible_devices_env
from yard.ports import BackendStartError
from yard.supervisor.groups import signal_group, wait_group_gone
from yard.supervisor.pidfiles import Orphan, owner_alive, read_pid_file, reap, write_pid_file
from yard.supervisor.process import (
    LEFTOVER_WAIT_S,
    LOOPBACK,
    Hurry,
    ManagedProcess,
    open_log,
)
from yard.supervisor.readiness import fills_context


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


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
        self._hurry = Hurry()
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
        self._hurry.now()

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

    def command_for(
        self,
        backend: BackendConfig,
        port: int,
        gpus: tuple[str, ...],
        context: int | None = None,
        parallel: int | None = None,
    ) -> list[str]:
        """The backend's argv with every placeholder filled in."""
        values = self._placeholders(backend, port, gpus, context, parallel)
        return [arg.format_map(values) for arg in programs.expand(backend.command)]

    def _placeholders(
        self,
        backend: BackendConfig,
        port: int,
        gpus: tuple[str, ...],
        context: int | None = None,
        parallel: int | None = None,
    ) -> dict[str, str]:
        total = "" if context is None or parallel is None else str(context * parallel)
        return {
            # The core's choices within the backend's context and parallel ranges.
            "context": "" if context is None else str(context),
            "parallel": "" if parallel is None else str(parallel),
            "total_context": total,
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
        self,
        backend: str,
        gpus: tuple[str, ...],
        *,
        measure: bool = False,
        context: int | None = None,
        parallel: int | None = None,
    ) -> ManagedProcess:
        """Start ``backend`` placed on ``gpus`` and return at once (not ready
        yet; see :meth:`ManagedProcess.wait_ready`). ``measure``: this is a
        measured first load; a llama-server backend then gets its context
        filled before it is ready (:func:`fills_context`). ``context``: the
        context size chosen for a backend with a context range, its
        ``{context}`` placeholder; ``parallel``: the slot count chosen within a
        parallel range, its ``{parallel}`` (and ``{total_context}``, context x
        parallel).

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
        try:
            # {llama_server}: found now, not when the file was read (yard.config.programs).
            command = programs.expand(config.command)
        except programs.ProgramNotFound as exc:
            raise BackendStartError(f"cannot start {backend}: {exc}") from None
        port = free_port()
        values = self._placeholders(config, port, gpus, context, parallel)
        argv = [arg.format_map(values) for arg in command]
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
        log = open_log(self._log_dir / f"{backend}.log")
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
                signal_group(process.pid, signal.SIGKILL)
                await process.wait()
                with trio.move_on_after(LEFTOVER_WAIT_S):
                    await wait_group_gone(process.pid)
            self._spawn_done()
            log.write(b"[yard] killed at once: yard is shutting down\n")
            log.close()
            raise BackendStartError(f"{backend}: not started, yard is shutting down")
        self._spawn_done()
        self._run_dir.mkdir(parents=True, exist_ok=True)
        pid_file = self._run_dir / f"{backend}.pid"
        write_pid_file(pid_file, backend, process.pid, argv)
        managed = ManagedProcess(
            config=config,
            process=process,
            port=port,
            argv=argv,
            log=log,
            ring=ring,
            pid_file=pid_file,
            hurry=self._hurry,
            on_exit=self._exited,
            fill_context=fills_context(config, argv, measure=measure),
        )
        self._processes[backend] = managed
        self._launches += 1
        assert process.stdout is not None and process.stderr is not None
        self._nursery.start_soon(managed.read_stream, process.stdout)
        self._nursery.start_soon(managed.read_stream, process.stderr)
        self._nursery.start_soon(managed.watch)
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
            record = read_pid_file(path)
            if record is not None and (record.get("pid") in mine or owner_alive(record)):
                continue
            orphan = await reap(path, record)
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

    # called by each ManagedProcess

    def _exited(self, process: ManagedProcess) -> None:
        self._exits += 1
        if process.exit_status is not None and process.exit_status.oom:
            self._oom_exits += 1

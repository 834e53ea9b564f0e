"""What ``yard serve`` says it does, at INFO (``server.log_level``).

Two sources, one logger (``yard.serve``, so that one level setting covers
them): the core's decisions to start or stop a backend and to reject or
requeue a request, each with the core's reason (:func:`log_decisions`, fed
by the engine's decision feed), and what became of each backend process:
ready, stopped, exited on its own, failed to start (:class:`LoggingLauncher`,
a wrapper around the supervisor as the engine sees it).
"""

from __future__ import annotations

import logging

import trio

from yard.core.decisions import (
    Decision,
    Dispatch,
    Reject,
    Requeue,
    StartBackend,
    StopBackend,
)
from yard.engine import Engine, LoggedDecision
from yard.ports import (
    BackendProcess,
    BackendStartError,
    ExitStatus,
    Launcher,
    TellsWhatItTook,
    Took,
)

log = logging.getLogger("yard.serve")


class LoggingLauncher:
    """The supervisor as the engine sees it, saying at INFO what becomes of
    each backend process: ready (and how long it took), stopped, or exited on
    its own (WARNING, with its last log lines), so that ``yard serve``'s
    output shows what yard does. The core's start and stop decisions, with
    their reasons, are logged by :func:`log_decisions`."""

    def __init__(self, launcher: Launcher) -> None:
        self._launcher = launcher

    async def launch(
        self,
        backend: str,
        gpus: tuple[str, ...],
        *,
        measure: bool = False,
        context: int | None = None,
        parallel: int | None = None,
    ) -> BackendProcess:
        """Launch through the wrapped launcher, ``measure``, ``context`` and
        ``parallel`` passed on."""
        try:
            process = await self._launcher.launch(
                backend, gpus, measure=measure, context=context, parallel=parallel
            )
        except BackendStartError as exc:
            log.warning("%s could not be started: %s", backend, exc.detail)
            raise
        log.debug("%s launched (pid %s, %s)", backend, process.pid, process.base_url)
        return _LoggedProcess(process)


class _LoggedProcess:
    def __init__(self, process: BackendProcess) -> None:
        self._process = process
        self._launched_at = trio.current_time()

    @property
    def name(self) -> str:
        return self._process.name

    @property
    def base_url(self) -> str:
        return self._process.base_url

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def took(self) -> Took | None:
        p = self._process
        return p.took if isinstance(p, TellsWhatItTook) else None

    async def wait_ready(self) -> None:
        try:
            await self._process.wait_ready()
        except BackendStartError as exc:
            log.warning("%s failed to start: %s", self.name, exc.detail)
            raise
        load_s = trio.current_time() - self._launched_at
        told = self.took
        took = ""
        if told is not None:
            took = f", the server took context {told.context} and {told.slots} slot(s)"
        log.info("%s is ready (%.1f s after launch, %s%s)", self.name, load_s, self.base_url, took)

    async def wait_exit(self) -> ExitStatus:
        # The engine waits here only while it has not asked for a stop (it
        # cancels this wait first): returning means the backend ended on its own.
        status = await self._process.wait_exit()
        log.warning("%s", status.detail or f"{self.name} exited (code {status.code})")
        return status

    async def stop(self) -> ExitStatus:
        status = await self._process.stop()
        log.info("%s stopped", self.name)
        return status


def describe_decision(decision: Decision) -> tuple[int, str] | None:
    """The log level and line for one core decision, or None for those the
    engine logs itself (flags, raised profiles). The core's reasons already
    say what they are about ("starting llm: ..."); the subject is added only
    when a reason leaves it out."""
    match decision:
        case StartBackend(backend=backend, reason=reason):
            return logging.INFO, _about(f"starting {backend}", reason)
        case StopBackend(backend=backend, reason=reason):
            return logging.INFO, _about(f"stopping {backend}", reason)
        case Reject(request_id=request_id, status=status, code=code, reason=reason):
            return logging.INFO, f"rejected ({status} {code}) " + _about(request_id, reason)
        case Requeue(request_id=request_id, reason=reason):
            return logging.INFO, "requeued " + _about(request_id, reason)
        case Dispatch(request_id=request_id, backend=backend, reason=reason):
            return logging.DEBUG, f"dispatched {request_id} to {backend}: {reason}"
    return None


def _about(subject: str, reason: str) -> str:
    return reason if reason.startswith(subject) else f"{subject}: {reason}"


LOG_PAUSE_S = 0.05
"""How long the decision log rests after each batch (see :func:`log_decisions`)."""


def logged_kinds() -> tuple[type[Decision], ...]:
    """The decision types :func:`log_decisions` takes from the engine: those it
    logs at INFO, and dispatches too only while DEBUG is on (one per request,
    which would otherwise enter its feed for nothing)."""
    kinds: tuple[type[Decision], ...] = (StartBackend, StopBackend, Reject, Requeue)
    return (*kinds, Dispatch) if log.isEnabledFor(logging.DEBUG) else kinds


async def log_decisions(
    engine: Engine, feed: trio.MemoryReceiveChannel[LoggedDecision], stop: trio.Event
) -> None:
    """Log the core's decisions as the engine makes them (see
    :func:`describe_decision`) until cancelled, or until the engine closes
    its feeds after ``stop``. ``feed`` is ``engine.subscribe(logged_kinds())``,
    taken before the engine runs so that its first decisions are seen too.

    A decision is logged at once when the log is idle; after each batch the
    task rests :data:`LOG_PAUSE_S` and then takes everything that came in
    meanwhile in one go. The engine decides once per request (a dispatch), and
    waking this task for each one cost every proxied request a task switch;
    this way it wakes at most about 20 times a second, whatever the load."""
    while True:
        async with feed:
            try:
                while True:
                    _log_decision(await feed.receive())
                    while True:
                        try:
                            logged = feed.receive_nowait()
                        except trio.WouldBlock:
                            break
                        _log_decision(logged)
                    await trio.sleep(LOG_PAUSE_S)
            except trio.EndOfChannel:
                pass
        if stop.is_set():
            return
        # The engine drops a subscriber that falls behind (it never waits):
        # say so and follow again.
        log.warning("the decision log fell behind; some decisions were not logged")
        feed = engine.subscribe(logged_kinds())


def _log_decision(logged: LoggedDecision) -> None:
    if type(logged.decision) is Dispatch and not log.isEnabledFor(logging.DEBUG):
        # One per request: not even formatted unless asked for.
        return
    line = describe_decision(logged.decision)
    if line is not None:
        log.log(line[0], "%s", line[1])

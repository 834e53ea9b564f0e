"""The engine's backend processes: carrying out ``StartBackend`` and ``StopBackend``.

One task per backend runs its life through the :class:`~yard.ports.Launcher`:
launch, wait until ready (a measured first load sampled meanwhile), watch for its
exit, stop it on request and wait (bounded) until its memory shows as free. Every
outcome reaches the core as an event (``BackendReady``, ``BackendStartFailed``,
``BackendExited``, ``BackendStopped``). A launcher or process that raises fails that
one start or stop, never the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from yard.core.decisions import StartBackend
from yard.core.events import (
    BackendExited,
    BackendLoading,
    BackendReady,
    BackendStartFailed,
    BackendStopped,
    Event,
)
from yard.engine.metering import Metering
from yard.engine.records import BackendRecord
from yard.ports import BackendProcess, BackendStartError, ExitStatus, Launcher, TellsWhatItTook

log = logging.getLogger("yard.engine")

# Bound on how long to wait for a stopped backend's memory to show as free.
_RELEASE_WAIT_S = 10.0

WARMUP_POLL_S = 1.0
"""How often a measured load's warm-up progress is looked at."""


class Backends:
    """The backend processes one engine started, and the tasks that run them.

    records: the engine's backend records by name, kept here (shared with the
        :class:`~yard.engine.metering.Metering`, which reads them).
    launcher: starts the processes. metering: samples first loads, stores
        measured profiles, tells when a stopped backend's memory is free.
    send_event: hands an event to the core. spawn: starts a task in the engine's
        nursery.
    start_timeout_s: per backend, how long start-up plus warm-up may take.
    warmup: per backend, the latest progress report of a measured load's
        warm-up (``"warm-up 40 % (...)"``), or None.
    """

    def __init__(
        self,
        *,
        records: dict[str, BackendRecord],
        launcher: Launcher,
        metering: Metering,
        send_event: Callable[[Event], None],
        spawn: Callable[..., None],
        start_timeout_s: Callable[[str], float],
        warmup: Callable[[str], str | None] = lambda backend: None,
    ) -> None:
        self.records = records
        self._launcher = launcher
        self._metering = metering
        self._send_event = send_event
        self._spawn = spawn
        self._start_timeout_s = start_timeout_s
        self._warmup = warmup
        # Counters for the engine's statistics().
        self.load_failures = 0
        self.ooms = 0

    def start(self, decision: StartBackend, nursery: trio.Nursery | None) -> bool:
        """Start the backend's task in ``nursery``; False (logged) when the
        backend is already running."""
        if decision.backend in self.records:
            log.error("core started %s, which is already running; ignored", decision.backend)
            return False
        assert nursery is not None
        record = BackendRecord(
            decision.backend, decision.gpus, decision.measure, decision.context, decision.parallel
        )
        self.records[decision.backend] = record
        nursery.start_soon(self._run, record)
        return True

    def stop(self, backend: str) -> None:
        """Ask the backend's task to stop it (once); one not running is reported
        stopped at once."""
        record = self.records.get(backend)
        if record is None:
            log.error("core stopped %s, which is not running", backend)
            self._send_event(BackendStopped(backend=backend))
            return
        if record.stop_requested:
            return
        record.stop_requested = True
        if record.scope is not None:
            record.scope.cancel()

    async def _run(self, record: BackendRecord) -> None:
        """One backend's life: launch, wait ready, watch for exit, stop on request."""
        name = record.name
        record.launched_at = trio.current_time()
        try:
            process = await self._launcher.launch(
                name,
                record.gpus,
                measure=record.measure,
                context=record.context,
                parallel=record.parallel,
            )
        except BackendStartError as exc:
            self.records.pop(name, None)
            self._started_failed(record, exc.detail, exc.oom)
            return
        except Exception as exc:
            # A launcher bug or an OS error must fail this start, not the engine.
            log.exception("launching %s failed", name)
            self.records.pop(name, None)
            self._started_failed(record, f"could not start {name}: {exc!r}", False)
            return
        record.process = process
        failure: tuple[str, bool] | None = None
        if not record.stop_requested:
            async with trio.open_nursery() as sampling:
                if record.measure and self._metering.meter is not None:
                    sampling.start_soon(self._metering.sample_first_load, record)
                with trio.CancelScope() as record.scope:
                    if record.stop_requested:
                        record.scope.cancel()
                    try:
                        timeout = self._start_timeout_s(name)
                        with trio.fail_after(timeout) as deadline:
                            if record.measure:
                                sampling.start_soon(self._watch_warmup, name, deadline, timeout)
                            await process.wait_ready()
                    except BackendStartError as exc:
                        failure = (exc.detail, exc.oom)
                    except trio.TooSlowError:
                        failure = (f"{name} did not become ready within {timeout:g} s", False)
                    except Exception as exc:
                        log.exception("waiting for %s to become ready failed", name)
                        failure = (f"{name} failed its start-up check: {exc!r}", False)
                record.scope = None
                sampling.cancel_scope.cancel()
        if record.stop_requested:
            await self._stop_process(record)
            return
        if failure is not None:
            # The process may still be alive (a hang); make sure it is gone.
            status = await self.stop_quietly(process)
            self.records.pop(name, None)
            self._started_failed(record, failure[0], failure[1] or status.oom)
            return
        record.ready = True
        if record.measure:
            await self._metering.last_sample(record)
        measured = self._metering.finish_measurement(record) if record.measure else None
        # What the server itself took (llama-server's /props) is what yard
        # reports; the memory profile stays at the context yard started it
        # with (its -c: the cache is allocated at it even where a slot is capped).
        took = process.took if isinstance(process, TellsWhatItTook) else None
        self._send_event(
            BackendReady(
                backend=name,
                context=took.context if took is not None else None,
                slots=took.slots if took is not None else None,
            )
        )
        if measured is not None:
            self._spawn(self._metering.store_profile, name, measured)
        with trio.CancelScope() as record.scope:
            if record.stop_requested:
                record.scope.cancel()
            status = await process.wait_exit()
            if not record.stop_requested:
                self.records.pop(name, None)
                if status.oom:
                    self.ooms += 1
                self._send_event(
                    BackendExited(
                        backend=name, exit_code=status.code, oom=status.oom, detail=status.detail
                    )
                )
                return
        record.scope = None
        await self._stop_process(record)

    async def _watch_warmup(self, name: str, deadline: trio.CancelScope, extend_s: float) -> None:
        """Tell the core (and the log) each progress report of a measured
        load's warm-up. A warm-up that reports progress is waited for: each
        report gives it the start-up timeout again from then, so a long
        context fill is not killed while it moves, and one that stalls is."""
        last: str | None = None
        while True:
            await trio.sleep(WARMUP_POLL_S)
            progress = self._warmup(name)
            if progress is None or progress == last:
                continue
            last = progress
            log.info("%s loading: %s", name, progress)
            self._send_event(BackendLoading(backend=name, progress=progress))
            deadline.deadline = max(deadline.deadline, trio.current_time() + extend_s)

    def _started_failed(self, record: BackendRecord, detail: str, oom: bool) -> None:
        self.load_failures += 1
        if oom:
            self.ooms += 1
        if record.stop_requested:
            self._send_event(BackendStopped(backend=record.name))
        else:
            self._send_event(BackendStartFailed(backend=record.name, detail=detail, oom=oom))

    async def stop_quietly(self, process: BackendProcess) -> ExitStatus:
        """Stop a process; a failure to stop is logged, and the core is told it is
        gone anyway (otherwise it would wait for that memory forever)."""
        try:
            return await process.stop()
        except Exception as exc:
            log.exception("stopping %s failed", process.name)
            return ExitStatus(code=None, detail=f"stop failed: {exc!r}")

    async def _stop_process(self, record: BackendRecord) -> None:
        process = record.process
        if process is not None:
            await self.stop_quietly(process)
            await self._wait_memory_released(record)
        self.records.pop(record.name, None)
        self._send_event(BackendStopped(backend=record.name))

    async def _wait_memory_released(self, record: BackendRecord) -> None:
        """After a stop, wait (bounded) until the meter no longer sees the backend's
        memory, so that the next load on its devices starts from what is really free."""
        if self._metering.meter is None or record.process is None or record.process.pid is None:
            return
        pids = {record.name: record.process.pid}
        with trio.move_on_after(_RELEASE_WAIT_S):
            while True:
                readings = await self._metering.read(pids)
                if not any(reading.backends.get(record.name, 0) for reading in readings):
                    return
                await trio.sleep(self._metering.profile_interval_s)

    async def stop_everything(self) -> None:
        """Stop every process at once (on shutdown) and forget them all."""
        processes = [r.process for r in self.records.values() if r.process is not None]
        async with trio.open_nursery() as nursery:
            for process in processes:
                nursery.start_soon(self.stop_quietly, process)
        self.records.clear()

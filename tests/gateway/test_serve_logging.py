"""What ``yard serve`` says at INFO: the core's decisions with their reasons,
and what becomes of each backend process (fakes, virtual time)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import cast

import pytest
import trio

from yard.core.decisions import (
    Decision,
    Dispatch,
    Flag,
    Reject,
    Requeue,
    StartBackend,
    StopBackend,
)
from yard.engine import Engine, LoggedDecision
from yard.observe.activity import (
    LOG_PAUSE_S,
    LoggingLauncher,
    describe_decision,
    log_decisions,
    logged_kinds,
)
from yard.ports import BackendStartError, ExitStatus


def test_decisions_are_logged_with_the_cores_reason_naming_their_subject_once() -> None:
    start = StartBackend(backend="llm", gpus=("gpu0",), reason="starting llm: 1 request waiting")
    assert describe_decision(start) == (logging.INFO, "starting llm: 1 request waiting")
    assert describe_decision(StartBackend(backend="tts", reason="pinned")) == (
        logging.INFO,
        "starting tts: pinned",
    )
    assert describe_decision(StopBackend(backend="tts", reason="idle for 300 s")) == (
        logging.INFO,
        "stopping tts: idle for 300 s",
    )
    reject = Reject(
        request_id="r1", status=503, code="queue_full", message="try later", reason="64 waiting"
    )
    assert describe_decision(reject) == (logging.INFO, "rejected (503 queue_full) r1: 64 waiting")
    late = Reject(
        request_id="r9", status=409, code="deadline_infeasible", message="m", reason="r9: too late"
    )
    assert describe_decision(late) == (
        logging.INFO,
        "rejected (409 deadline_infeasible) r9: too late",
    )
    assert describe_decision(Requeue(request_id="r2", reason="llm died of an OOM yard caused")) == (
        logging.INFO,
        "requeued r2: llm died of an OOM yard caused",
    )
    dispatch = Dispatch(request_id="r3", backend="llm", reason="slot free")
    assert describe_decision(dispatch) == (logging.DEBUG, "dispatched r3 to llm: slot free")
    # The engine logs flags itself.
    assert describe_decision(Flag(reason="late")) is None


@dataclass
class _Process:
    name: str
    ready_after: float = 2.0
    fails: str | None = None
    exits_after: float | None = None
    exited: trio.Event = field(default_factory=trio.Event)

    @property
    def base_url(self) -> str:
        return "http://127.0.0.1:9"

    @property
    def pid(self) -> int | None:
        return 4242

    async def wait_ready(self) -> None:
        await trio.sleep(self.ready_after)
        if self.fails is not None:
            raise BackendStartError(self.fails)

    async def wait_exit(self) -> ExitStatus:
        if self.exits_after is None:
            await self.exited.wait()
        else:
            await trio.sleep(self.exits_after)
        return ExitStatus(code=1, detail=f"{self.name} exited with code 1; last log lines: boom")

    async def stop(self) -> ExitStatus:
        self.exited.set()
        return ExitStatus(code=0, detail=f"{self.name} exited with code 0 after yard asked")


@dataclass
class _Launcher:
    processes: dict[str, _Process]
    measured: list[bool] = field(default_factory=list)

    async def launch(
        self,
        backend: str,
        gpus: tuple[str, ...],
        *,
        measure: bool = False,
        context: int | None = None,
        parallel: int | None = None,
    ) -> _Process:
        self.measured.append(measure)
        if backend not in self.processes:
            raise BackendStartError(f"{backend}: command not found")
        return self.processes[backend]


async def test_backend_ready_stop_exit_and_failures_are_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    inner = _Launcher(
        {
            "llm": _Process("llm", ready_after=2.5),
            "tts": _Process("tts", exits_after=1.0),
            "bad": _Process("bad", fails="bad exited with code 2 before it was ready"),
        }
    )
    launcher = LoggingLauncher(inner)
    with caplog.at_level(logging.INFO, logger="yard.serve"):
        llm = await launcher.launch("llm", (), measure=True)
        await llm.wait_ready()
        await llm.stop()
        tts = await launcher.launch("tts", ("gpu0",))
        await tts.wait_exit()
        bad = await launcher.launch("bad", ())
        with pytest.raises(BackendStartError):
            await bad.wait_ready()
        with pytest.raises(BackendStartError):
            await launcher.launch("gone", ())
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "llm is ready (2.5 s after launch, http://127.0.0.1:9)"),
        ("INFO", "llm stopped"),
        ("WARNING", "tts exited with code 1; last log lines: boom"),
        ("WARNING", "bad failed to start: bad exited with code 2 before it was ready"),
        ("WARNING", "gone could not be started: gone: command not found"),
    ]
    # measure reaches a launcher that takes it; the process keeps its identity.
    assert inner.measured == [True, False, False, False]
    assert (llm.name, llm.pid, llm.base_url) == ("llm", 4242, "http://127.0.0.1:9")


class _Feeds:
    """The engine's subscribe(), as log_decisions sees it."""

    def __init__(self) -> None:
        self.senders: list[trio.MemorySendChannel[LoggedDecision]] = []
        self.kinds: list[tuple[type[Decision], ...] | None] = []

    def subscribe(
        self, kinds: tuple[type[Decision], ...] | None = None
    ) -> trio.MemoryReceiveChannel[LoggedDecision]:
        send, receive = trio.open_memory_channel[LoggedDecision](10)
        self.senders.append(send)
        self.kinds.append(kinds)
        return receive


async def test_decision_log_follows_again_when_dropped_and_ends_after_stop(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    feeds = _Feeds()
    stop = trio.Event()
    engine = cast(Engine, feeds)
    with caplog.at_level(logging.INFO, logger="yard.serve"), trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log_decisions, engine, feeds.subscribe(), stop)
            first = feeds.senders[0]
            await first.send(LoggedDecision(at=0.0, decision=StopBackend(backend="a", reason="x")))
            await first.send(
                LoggedDecision(
                    at=0.0, decision=Dispatch(request_id="r", backend="a", reason="free")
                )
            )
            await first.aclose()  # dropped for falling behind
            await trio.sleep(1)
            assert len(feeds.senders) == 2
            await feeds.senders[1].send(
                LoggedDecision(at=1.0, decision=StartBackend(backend="a", reason="again"))
            )
            await trio.sleep(1)
            stop.set()
            await feeds.senders[1].aclose()  # the engine closes its feeds at shutdown
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "stopping a: x"),
        ("WARNING", "the decision log fell behind; some decisions were not logged"),
        ("INFO", "starting a: again"),
    ]
    assert len(feeds.senders) == 2
    # It follows again without dispatches, which it does not log at INFO.
    assert feeds.kinds[1] == (StartBackend, StopBackend, Reject, Requeue)


def test_the_decision_log_asks_for_dispatches_only_while_debug_is_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="yard.serve"):
        assert Dispatch not in logged_kinds()
    with caplog.at_level(logging.DEBUG, logger="yard.serve"):
        assert logged_kinds() == (StartBackend, StopBackend, Reject, Requeue, Dispatch)


async def test_decision_log_takes_a_burst_in_one_go_after_a_short_rest(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    feeds = _Feeds()
    stop = trio.Event()
    logged_at: list[tuple[float, str]] = []

    class _Times(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged_at.append((trio.current_time(), record.getMessage()))

    handler = _Times()
    logger = logging.getLogger("yard.serve")
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.DEBUG, logger="yard.serve"), trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(log_decisions, cast(Engine, feeds), feeds.subscribe(), stop)
                feed = feeds.senders[0]
                await trio.sleep(1)
                await feed.send(
                    LoggedDecision(at=1.0, decision=StartBackend(backend="a", reason="asked"))
                )
                await trio.sleep(0.01)
                for i in range(3):
                    await feed.send(
                        LoggedDecision(
                            at=1.01, decision=Dispatch(request_id=f"r{i}", backend="a", reason="f")
                        )
                    )
                await trio.sleep(1)
                stop.set()
                await feed.aclose()
    finally:
        logger.removeHandler(handler)
    assert logged_at == [
        (1.0, "starting a: asked"),
        (1.0 + LOG_PAUSE_S, "dispatched r0 to a: f"),
        (1.0 + LOG_PAUSE_S, "dispatched r1 to a: f"),
        (1.0 + LOG_PAUSE_S, "dispatched r2 to a: f"),
    ]
    assert len(feeds.senders) == 1

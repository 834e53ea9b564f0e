"""A measured load's warm-up progress: told to the core, and waited for while it moves."""

from __future__ import annotations

import trio
import trio.testing

from yard.core import BackendLoading, BackendReady, BackendStartFailed, Decision, StartBackend
from yard.core.events import Event, RequestArrived
from yard.engine import Engine
from yard.testing.ports import FakeLauncher, Script, ScriptedPolicy


class Logs:
    """The supervisor's ring: a progress line every 20 s of the load, up to ``until``."""

    def __init__(self, until: float) -> None:
        self.t0 = 0.0
        self.until = until

    def backend_log(self, backend: str) -> list[str]:
        elapsed = min(trio.current_time() - self.t0, self.until)
        step = int(elapsed // 20)
        return ["[yard] measured first load: filling a slot's context (the worst case)"] + [
            f"[yard] warm-up {10 * i} % ({i} of 10 batches)" for i in range(step + 1)
        ]


def measured_start(event: Event, now: float) -> list[Decision]:
    if isinstance(event, RequestArrived):
        return [StartBackend(reason="first", backend="llm", measure=True)]
    return []


async def run(ready_after_s: float, progress_until: float) -> ScriptedPolicy:
    policy = ScriptedPolicy(measured_start, ("llm",))
    logs = Logs(progress_until)
    engine = Engine(
        scheduler=policy,
        launcher=FakeLauncher({"llm": Script(ready_after_s=ready_after_s)}),
        logs=logs,
        start_timeout_s=lambda backend: 30.0,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        logs.t0 = trio.current_time()
        engine.submit(backend="llm", priority=10, request_id="a")
        await trio.sleep(300)
        nursery.cancel_scope.cancel()
    return policy


async def test_a_warm_up_that_reports_progress_is_waited_for_past_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = await run(ready_after_s=95, progress_until=95)
    progress = [
        e.progress for _, e in policy.events_of(BackendLoading) if isinstance(e, BackendLoading)
    ]
    assert progress[0].startswith("warm-up 0 %")
    assert progress[-1].startswith("warm-up 40 %")
    [(ready_at, _)] = policy.events_of(BackendReady)
    assert policy.events_of(BackendStartFailed) == []
    assert ready_at - policy.seen[0][0] == 95


async def test_a_warm_up_that_stalls_fails_after_the_timeout_from_its_last_report(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = await run(ready_after_s=200, progress_until=45)
    [(failed_at, failed)] = policy.events_of(BackendStartFailed)
    assert isinstance(failed, BackendStartFailed) and "within 30 s" in failed.detail
    # Last report (20 %) read at 41 s: the timeout counts 30 s from there.
    assert failed_at - policy.seen[0][0] == 71
    assert policy.events_of(BackendReady) == []

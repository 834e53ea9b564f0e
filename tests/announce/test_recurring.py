"""Recurring announcements: the [[announcements]] checks, the windows a cron
schedule opens, and the service keeping the next window announced."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.announce.test_service import APPS, config
from tests.jobs.harness import EPOCH, wall
from yard.announce.service import Announcements, Limits
from yard.announce.store import AnnouncementStore
from yard.config.announcements import Recurring, next_window, parse
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.jobs.store import JobStore
from yard.testing.ports import FakeLauncher, Script

NEWS = {
    "model": "news-llm",
    "app": "radio",
    "schedule": "50 * * * *",
    "window_s": 600,
    "count": 3,
    "priority": 90,
}


def entry(**changes: object) -> Recurring:
    return parse([{**NEWS, **changes}], apps=list(APPS), models=["news-llm", "chat-llm"])[0]


def test_an_hourly_window_from_50_past() -> None:
    news = entry()
    # 2026-01-01T00:00:00Z + 10 min: the next window opens at 00:50
    assert next_window(news, EPOCH + 600) == (EPOCH + 3000, EPOCH + 3600)
    # inside the window: that window
    assert next_window(news, EPOCH + 3100) == (EPOCH + 3000, EPOCH + 3600)
    # at its end: the next hour's
    assert next_window(news, EPOCH + 3600) == (EPOCH + 6600, EPOCH + 7200)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schedule": "61 * * * *"}, "announcements[0].schedule: '61 * * * *' is not a cron"),
        ({"schedule": 5}, "announcements[0].schedule: must be a cron expression"),
        ({"model": "nope"}, "announcements[0].model: must name a configured model"),
        ({"app": "nobody"}, "announcements[0].app: must name a configured app"),
        ({"window_s": 0}, "announcements[0].window_s: must be a number of seconds > 0"),
        ({"window_s": 90_000}, "announcements[0].window_s: must be a number of seconds > 0"),
        ({"count": 0}, "announcements[0].count: must be a whole number"),
        ({"priority": "high"}, "announcements[0].priority: must be a number"),
        ({"colour": "red"}, "announcements[0].colour: unknown key"),
    ],
)
def test_bad_entries_are_refused_naming_the_key(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        entry(**changes)
    assert str(caught.value).startswith(message)


async def test_the_service_keeps_the_next_window_announced(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="news", slots=1), BackendSpec(name="chat", slots=1)],
        SchedulerConfig(aging_rate=1.0),
    )
    launcher = FakeLauncher({"news": Script(ready_after_s=5)})
    engine = Engine(scheduler=scheduler, launcher=launcher)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        store = await JobStore.open(tmp_path / "jobs.sqlite", threaded=False)
        service = Announcements(
            engine=engine,
            store=AnnouncementStore(store.database),
            config=config(),
            limits=Limits(),
            recurring=[entry(priority=100)],
            wall=wall,
        )
        await nursery.start(service.run)
        with trio.fail_after(3 * 3600):
            await trio.sleep(2 * 3600 + 60)
        records = sorted(await service.listed(app="radio"), key=lambda r: r.not_before)
        nursery.cancel_scope.cancel()
    await store.close()
    assert [(r.not_before - EPOCH, r.status, r.source) for r in records] == [
        (3000.0, "expired", "config"),
        (6600.0, "expired", "config"),
        (10200.0, "open", "config"),
    ]
    assert {r.priority for r in records} == {80.0}  # radio's max_priority
    # loaded ahead of the first window (3000 - 30 s assumed - 2 s); no idle_ttl_s: it stays
    assert [(t, name) for t, name, _ in launcher.launched] == [(2968.0, "news")]

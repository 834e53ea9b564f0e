"""Announcements with the real engine and core, on virtual time (fake backend
processes): loads done ahead, expiry, withdrawal, the cap, the clamp, the
app's models scope, restore after a restart, and the HTTP answers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.jobs.harness import EPOCH, wall
from yard.announce.metrics import AnnouncementCollector
from yard.announce.service import AnnouncementNotFound, Announcements, BadAnnouncement, Limits
from yard.announce.store import AnnouncementStore, Status
from yard.app.web import Parts, create_control_app
from yard.config import AppConfig, BackendConfig, Config, JobsConfig, ServerConfig
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.engine import Engine
from yard.jobs.store import JobStore
from yard.testing.ports import FakeLauncher, Script

APPS = {
    "radio": AppConfig(
        name="radio", key="sk-radio", default_priority=50.0, max_priority=80.0, models=("news*",)
    ),
    "web": AppConfig(name="web", key="sk-web", default_priority=50.0, max_priority=100.0),
}


def config() -> Config:
    backends = {
        "news": BackendConfig(name="news", models=("news-llm",), command=("true",)),
        "chat": BackendConfig(name="chat", models=("chat-llm",), command=("true",)),
    }
    return Config(
        path=Path("/nonexistent/yard.toml"),
        server=ServerConfig(default_priority=50.0),
        scheduler=SchedulerConfig(),
        devices={},
        apps=APPS,
        backends=backends,
    )


def iso(t: float) -> str:
    """The RFC 3339 time of virtual time ``t``."""
    return datetime.fromtimestamp(EPOCH + t, UTC).isoformat().replace("+00:00", "Z")


class Yard:
    def __init__(
        self, engine: Engine, service: Announcements, launcher: FakeLauncher, parts: Parts
    ) -> None:
        self.engine = engine
        self.service = service
        self.launcher = launcher
        self.parts = parts


class SlowStore(AnnouncementStore):
    """The store on a loaded disk: each synced write of an end takes a second."""

    async def end(self, announcement_id: str, status: Status, used: int, at: float) -> bool:
        await trio.sleep(1)
        return await super().end(announcement_id, status, used, at)


@asynccontextmanager
async def yard(
    path: Path,
    *,
    limit: int = 16,
    store_type: type[AnnouncementStore] = AnnouncementStore,
    keep_ended_per_app: int = 1000,
) -> AsyncIterator[Yard]:
    """One run of yard's engine + announcements; leaving the block is a crash."""
    scheduler = Scheduler(
        [DeviceSpec(name="host", kind="host", total_bytes=64 * 2**30)],
        [BackendSpec(name="news", slots=1), BackendSpec(name="chat", slots=1)],
        SchedulerConfig(aging_rate=1.0),
    )
    launcher = FakeLauncher({"news": Script(ready_after_s=5), "chat": Script(ready_after_s=5)})
    engine = Engine(scheduler=scheduler, launcher=launcher)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        store = await JobStore.open(path / "jobs.sqlite", threaded=False)
        service = Announcements(
            engine=engine,
            store=store_type(store.database),
            config=config(),
            limits=Limits(default=limit),
            wall=wall,
            keep_ended_per_app=keep_ended_per_app,
        )
        parts = Parts(config=config(), engine=engine, announcements=service)
        try:
            await nursery.start(service.run)
            yield Yard(engine, service, launcher, parts)
            nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await store.close()


def body(**fields: object) -> dict[str, object]:
    return {"model": "news-llm", "count": 3, "priority": 70, **fields}


async def test_an_announcement_loads_its_model_ahead_of_the_window(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path) as y:
        made = await y.service.create(APPS["radio"], body(start_after=100, window_s=600))
        assert made.status == "open"
        await trio.sleep(200)
        # No profile yet: the core assumes 30 s (default_load_s), plus the 2 s margin.
        assert [(t, name) for t, name, _ in y.launcher.launched] == [(68.0, "news")]
        reasons = [d.decision.reason for d in y.engine.decisions()]
        assert any(r.startswith("starting news: loading news now: 3 announced") for r in reasons)


async def test_an_unused_announcement_expires_at_its_windows_end_and_is_counted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path) as y:
        made = await y.service.create(APPS["radio"], body(start_after=10, window_s=50))
        await trio.sleep(61)
        record = await y.service.get(made.id, app="radio")
        assert record.status == "expired"
        assert record.ended_at == EPOCH + 60
        assert y.service.counts() == {("radio", "expired"): 1}
        families = list(AnnouncementCollector(y.service).collect())
        assert [(s.name, s.labels, s.value) for s in families[0].samples] == [
            ("yard_announcements_total", {"app": "radio", "outcome": "expired"}, 1.0)
        ]


async def test_an_announcement_reads_used_as_soon_as_its_last_request_came(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The end is written to the store a second later; what the API and /metrics
    # answer must not wait for it (a client that sent the announced requests and
    # then asks sees them counted).
    async with yard(tmp_path, store_type=SlowStore) as y:
        made = await y.service.create(APPS["radio"], body(count=2, window_s=600))
        for _ in range(2):
            y.engine.submit(backend="news", priority=70.0, app="radio")
        await trio.sleep(0.5)
        record = await y.service.get(made.id, app="radio")
        assert (record.status, record.used, record.ended_at) == ("used", 2, EPOCH)
        assert [(r.status, r.used) for r in await y.service.listed(app="radio")] == [("used", 2)]
        assert y.service.counts() == {("radio", "used"): 1}
        await trio.sleep(2)
        stored = await y.service.store.get(made.id)
        assert stored is not None
        assert (stored.status, stored.used, stored.ended_at) == ("used", 2, EPOCH)


async def test_a_withdrawn_announcement_ends_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path) as y:
        made = await y.service.create(APPS["radio"], body(start_after=100, window_s=60))
        record = await y.service.withdraw(made.id, app="radio")
        assert record.status == "withdrawn"
        await trio.sleep(300)
        assert y.service.counts() == {("radio", "withdrawn"): 1}
        assert y.launcher.launched == []


async def test_priority_is_clamped_to_the_apps_cap(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path) as y:
        made = await y.service.create(APPS["radio"], body(priority=100, window_s=60))
        assert made.priority == 80.0


async def test_an_app_may_not_announce_a_model_outside_its_scope(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path) as y:
        with pytest.raises(BadAnnouncement) as caught:
            await y.service.create(APPS["radio"], body(model="chat-llm", window_s=60))
        assert (caught.value.status, caught.value.code) == (404, "model_not_found")
        # the other app's announcements do not exist for it
        made = await y.service.create(APPS["web"], body(model="chat-llm", window_s=60))
        assert [r.id for r in await y.service.listed(app="radio")] == []
        assert [r.id for r in await y.service.listed(app="web")] == [made.id]


async def test_open_announcements_are_capped_per_app(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path, limit=2) as y:
        for _ in range(2):
            await y.service.create(APPS["radio"], body(window_s=600))
        with pytest.raises(BadAnnouncement) as caught:
            await y.service.create(APPS["radio"], body(window_s=600))
        assert (caught.value.status, caught.value.code) == (429, "too_many_announcements")
        await y.service.create(APPS["web"], body(model="chat-llm", window_s=600))


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"model": 3}, "invalid_request", "model"),
        ({"window_s": 60, "colour": "red"}, "unknown_parameter", "colour"),
        ({"start_after": 5, "not_before": iso(10), "window_s": 60}, "invalid_window", "not_before"),
        ({"start_by": iso(100), "window_s": 60}, "invalid_window", "start_by"),
        ({}, "invalid_window", "start_by"),
        ({"not_before": "13:50", "window_s": 60}, "invalid_window", "not_before"),
        ({"not_before": iso(100), "start_by": iso(50)}, "invalid_window", "start_by"),
        ({"start_by": iso(-10)}, "invalid_window", "start_by"),
        ({"window_s": -1}, "invalid_window", "window_s"),
        ({"window_s": 86401}, "invalid_window", "window_s"),
        ({"window_s": 60, "count": 0}, "invalid_count", "count"),
        ({"window_s": 60, "count": True}, "invalid_count", "count"),
        ({"window_s": 60, "priority": "high"}, "invalid_priority", "priority"),
    ],
)
async def test_bad_announcements_get_400s_that_name_the_field(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    fields: dict[str, object],
    code: str,
    param: str,
) -> None:
    async with yard(tmp_path) as y:
        with pytest.raises(BadAnnouncement) as caught:
            await y.service.create(APPS["radio"], {"model": "news-llm", **fields})
        assert (caught.value.status, caught.value.code, caught.value.param) == (400, code, param)
        assert await y.service.listed(app="radio") == []


async def test_announcements_are_restored_into_the_core_after_a_restart(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path) as y:
        made = await y.service.create(APPS["radio"], body(start_after=300, window_s=600))
        await trio.sleep(10)  # yard dies long before the window
    assert trio.current_time() == 10
    async with yard(tmp_path) as y:
        await trio.sleep(400)
        # loaded ahead for the window it was told again: 300 - 30 - 2
        assert [(t, name) for t, name, _ in y.launcher.launched] == [(268.0, "news")]
        assert (await y.service.get(made.id, app="radio")).status == "open"
        await trio.sleep(600)
        assert (await y.service.get(made.id, app="radio")).status == "expired"


async def test_the_http_api_answers_in_openais_shapes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path) as y:
        client = create_control_app(y.parts).test_client()
        radio = {"authorization": "Bearer sk-radio"}
        made = await client.post(
            "/v1/announcements", json=body(start_after=60, window_s=600), headers=radio
        )
        assert made.status_code == 201
        shown = await made.get_json()
        assert shown["object"] == "announcement"
        assert shown["not_before"] == iso(60).replace("Z", ".000Z")
        assert (shown["status"], shown["count"], shown["used"]) == ("open", 3, 0)
        listed = await (await client.get("/v1/announcements", headers=radio)).get_json()
        assert [a["id"] for a in listed["data"]] == [shown["id"]]
        other = await client.get(
            f"/v1/announcements/{shown['id']}", headers={"authorization": "Bearer sk-web"}
        )
        assert other.status_code == 404
        assert (await other.get_json())["error"]["code"] == "announcement_not_found"
        bad = await client.post(
            "/v1/announcements",
            json={"model": "news-llm", "count": 0, "window_s": 5},
            headers=radio,
        )
        assert bad.status_code == 400
        error = (await bad.get_json())["error"]
        assert (error["code"], error["param"], error["type"]) == (
            "invalid_count",
            "count",
            "invalid_request_error",
        )
        notjson = await client.post("/v1/announcements", data=b"{", headers=radio)
        assert json.loads(await notjson.get_data())["error"]["code"] == "invalid_json"
        gone = await client.delete(f"/v1/announcements/{shown['id']}", headers=radio)
        assert (await gone.get_json())["status"] == "withdrawn"


async def test_ended_announcements_are_deleted_after_the_job_record_retention(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # [jobs] result_ttl_s + record_ttl_s: as long as a finished job is listed.
    keep = JobsConfig().result_ttl_s + JobsConfig().record_ttl_s
    async with yard(tmp_path) as y:
        old = await y.service.create(APPS["radio"], body(window_s=600))
        await y.service.withdraw(old.id, app="radio")
        await trio.sleep(keep / 2)
        recent = await y.service.create(APPS["radio"], body(window_s=600))
        await y.service.withdraw(recent.id, app="radio")
        still_open = await y.service.create(APPS["web"], body(model="chat-llm", window_s=600))
        await trio.sleep(keep / 2 + 120)  # past old's retention and one reap
        assert [r.id for r in await y.service.listed(app=None)] == [still_open.id, recent.id]
        with pytest.raises(AnnouncementNotFound):
            await y.service.get(old.id, app="radio")


async def test_an_app_that_makes_and_withdraws_many_keeps_only_its_newest_ended_ones(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path, keep_ended_per_app=5) as y:
        made = []
        for _ in range(12):
            record = await y.service.create(APPS["radio"], body(window_s=600))
            await y.service.withdraw(record.id, app="radio")
            made.append(record.id)
        await trio.sleep(120)  # one reap
        assert [r.id for r in await y.service.listed(app="radio")] == made[::-1][:5]


async def test_a_body_nested_too_deep_is_a_400_in_the_error_shape(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with yard(tmp_path) as y:
        client = create_control_app(y.parts).test_client()
        deep = await client.post(
            "/v1/announcements",
            data=b"[" * 20_000 + b"]" * 20_000,
            headers={"authorization": "Bearer sk-radio", "content-type": "application/json"},
        )
        assert deep.status_code == 400
        assert (await deep.get_json())["error"]["code"] == "invalid_json"

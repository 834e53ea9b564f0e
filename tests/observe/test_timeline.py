"""The dashboard's timeline: the history of each backend at exact engine times,
the work ahead from the core, the SVG picture and ``GET /admin/timeline``."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing
from quart_trio import QuartTrio

from tests.observe.conftest import ADMIN_KEY, LOOPBACK, REMOTE
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.core.decisions import Dispatch, StartBackend, StopBackend
from yard.core.events import (
    AnnouncementMade,
    BackendExited,
    BackendReady,
    BackendStopped,
    RequestCancelled,
    RequestFinished,
)
from yard.core.views import Snapshot, WindowView
from yard.engine import Engine, LoggedDecision
from yard.observe import Observer, install
from yard.observe.timeline import AHEAD_MIN_S, JOIN_S, PAST_MIN_S, History, Span, build
from yard.observe.timeline_svg import render_svg
from yard.testing.engine import FakeEngine
from yard.testing.ports import FakeLauncher, Script

GiB = 2**30
SVG = "{http://www.w3.org/2000/svg}"
EPOCH = 1_780_000_000.0  # the wall-clock time the tests call engine time 0


def test_history_records_loading_loaded_serving_and_stopping_at_exact_times() -> None:
    history = History()
    see = history.see
    see(10.0, StartBackend(reason="needed", backend="llm", gpus=("gpu0",)))
    see(17.5, BackendReady(backend="llm"))
    see(17.5, Dispatch(reason="ready", request_id="a", backend="llm"))
    see(18.0, Dispatch(reason="slot", request_id="b", backend="llm"))
    see(20.0, RequestFinished(request_id="a"))
    see(21.0, RequestCancelled(request_id="b"))
    see(21.0, RequestFinished(request_id="b"))  # after its cancel: nothing more
    see(30.0, Dispatch(reason="ready", request_id="c", backend="llm"))
    see(31.0, RequestFinished(request_id="unknown"))
    see(32.0, RequestFinished(request_id="c"))
    # Less than JOIN_S after c: the same bar goes on.
    see(32.0 + JOIN_S - 0.5, Dispatch(reason="ready", request_id="d", backend="llm"))
    assert history.spans(35.0) == [
        Span(backend="llm", kind="loading", devices=("gpu0",), start=10.0, end=17.5),
        Span(backend="llm", kind="loaded", devices=("gpu0",), start=17.5, end=None),
        Span(
            backend="llm",
            kind="serving",
            devices=("gpu0",),
            start=17.5,
            end=21.0,
            note="up to 2 in flight, 1 served",
        ),
        Span(
            backend="llm",
            kind="serving",
            devices=("gpu0",),
            start=30.0,
            end=None,
            note="up to 1 in flight, 1 served",
        ),
    ]
    see(40.0, StopBackend(reason="idle for 600 s", backend="llm"))
    see(42.0, BackendStopped(backend="llm"))
    spans = history.spans(50.0)
    assert [(s.kind, s.start, s.end) for s in spans] == [
        ("loading", 10.0, 17.5),
        ("loaded", 17.5, 40.0),
        ("serving", 17.5, 21.0),
        ("serving", 30.0, 40.0),
        ("stopping", 40.0, 42.0),
    ]
    assert spans[1].note == "stopped: idle for 600 s"


def test_a_crash_ends_the_spans_and_the_history_keeps_one_hour_and_a_bounded_count() -> None:
    history = History(horizon_s=100.0, limit=3)
    history.see(0.0, StartBackend(reason="needed", backend="tts"))
    history.see(5.0, BackendReady(backend="tts"))
    history.see(6.0, Dispatch(reason="ready", request_id="a", backend="tts"))
    history.see(9.0, BackendExited(backend="tts", exit_code=-9, oom=True))
    spans = history.spans(9.0)
    assert [(s.kind, s.devices, s.end, s.note) for s in spans] == [
        ("loading", ("host",), 5.0, ""),
        ("loaded", ("host",), 9.0, "exited with code -9, out of memory"),
        ("serving", ("host",), 9.0, "up to 1 in flight, 0 served"),
    ]
    assert history.spans(109.5) == []  # all ended more than 100 s ago
    for t in range(4):
        history.see(200.0 + t, StartBackend(reason="again", backend="tts"))
    history.see(204.0, BackendReady(backend="tts"))
    kept = history.spans(204.0)
    # Three finished loads at most (the oldest went first), plus the one going on.
    assert [(s.kind, s.start, s.end) for s in kept] == [
        ("loading", 201.0, 202.0),
        ("loading", 202.0, 203.0),
        ("loading", 203.0, 204.0),
        ("loaded", 204.0, None),
    ]


@dataclass
class Yard:
    engine: Engine
    observer: Observer
    app: QuartTrio


@asynccontextmanager
async def running(*, admin_key: str | None = None) -> AsyncIterator[Yard]:
    """The real core and engine with fake processes (ready 5 s after launch),
    two backends on one GPU, and an observer serving them."""
    scheduler = Scheduler(
        [DeviceSpec(name="gpu0", kind="gpu", total_bytes=24 * GiB)],
        [
            BackendSpec(name="llm", gpus=("gpu0",), slots=2),
            BackendSpec(name="news", gpus=("gpu0",)),
        ],
        SchedulerConfig(aging_rate=1.0),
    )
    launcher = FakeLauncher({"llm": Script(ready_after_s=5), "news": Script(ready_after_s=5)})
    engine = Engine(scheduler=scheduler, launcher=launcher)
    observer = Observer(
        engine=engine,
        admin_key=admin_key,
        models={"llm": ("chat-llm",), "news": ("news-llm",)},
        placements={"llm": ("gpu0",), "news": ("gpu0",)},
    )
    app = QuartTrio(__name__)
    install(app, observer)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        yield Yard(engine, observer, app)
        nursery.cancel_scope.cancel()


async def a_busy_quarter_hour(engine: Engine) -> None:
    """llm loads (0-5 s), serves a (5-8 s), then b and c together (20-24 s);
    news-llm is announced for 30-40 min from now, and a web request for llm is
    held until 15 min."""
    a = engine.submit(backend="llm", priority=50, app="web", request_id="a")
    await a.wait_dispatched()
    await trio.sleep(3)
    a.report("ok")
    await trio.sleep(12)
    b = engine.submit(backend="llm", priority=50, app="web", request_id="b")
    await b.wait_dispatched()
    await trio.sleep(2)
    c = engine.submit(backend="llm", priority=50, app="web", request_id="c")
    await c.wait_dispatched()
    await trio.sleep(1)
    b.report("ok")
    await trio.sleep(1)
    c.report("ok")
    engine.send(
        AnnouncementMade(
            announcement_id="A",
            app="radio",
            backend="news",
            not_before=14.0 + 1800,
            start_by=14.0 + 2400,
            count=3,
            priority=70,
        )
    )
    engine.submit(backend="llm", priority=50, app="web", request_id="h", not_before=900.0)
    await trio.testing.wait_all_tasks_blocked()


async def test_the_timeline_zooms_to_recent_activity_and_shows_the_work_ahead_at_exact_times(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as y:
        await a_busy_quarter_hour(y.engine)
        assert trio.current_time() == 24.0
        document = y.observer.timeline(wall_now=EPOCH + 24.0)
    # 24 s of activity: the past shown is PAST_MIN_S, not the whole hour.
    assert (document["start"], document["now"], document["end"]) == (24.0 - 120, 24.0, 2424.0)
    assert document["beyond"] == 0
    assert [d["name"] for d in document["devices"]] == ["gpu0", "host"]
    gpu0, host = document["devices"]
    assert host["lanes"] == []
    llm, news = gpu0["lanes"]
    assert (llm["backend"], llm["models"]) == ("llm", ["chat-llm"])
    assert [(s["kind"], s["start"], s["end"], s["note"]) for s in llm["spans"]] == [
        ("loading", 0.0, 5.0, ""),
        ("loaded", 5.0, None, ""),
        ("serving", 5.0, 8.0, "up to 1 in flight, 1 served"),
        ("serving", 20.0, 24.0, "up to 2 in flight, 2 served"),
    ]
    assert llm["spans"][0]["end_wall"] == EPOCH + 5.0
    [held] = llm["windows"]
    assert (held["kind"], held["id"], held["app"], held["opens"]) == (
        "held",
        "held:h",
        "web",
        900.0,
    )
    assert news["spans"] == []
    [announced] = news["windows"]
    assert (announced["kind"], announced["id"], announced["app"], announced["left"]) == (
        "announced",
        "A",
        "radio",
        3,
    )
    assert (announced["opens"], announced["closes"]) == (1814.0, 2414.0)
    # No profile yet: the core counts a 30 s load and the 2 s lead margin, and
    # 3 s to drain llm (its longest recent request, on the same GPU) first.
    assert announced["loads_from"] == 1814.0 - 32.0 - 3.0
    assert announced["opens_wall"] == EPOCH + 1814.0


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def _title(element: ET.Element) -> str:
    title = element.find(f"{SVG}title")
    assert title is not None and title.text is not None
    return title.text


async def test_the_picture_has_a_row_per_device_bars_windows_and_a_now_line(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as y:
        await a_busy_quarter_hour(y.engine)
        document = y.observer.timeline(wall_now=EPOCH + 24.0)
    root = _parse(render_svg(document))
    rows = root.findall(f"{SVG}g[@class='device']")
    assert [r.get("data-row") for r in rows] == ["gpu0", "host"]
    lanes = rows[0].findall(f"{SVG}g[@class='lane']")
    assert [lane.get("data-lane") for lane in lanes] == ["llm", "news"]
    llm = lanes[0]
    serving = llm.findall(f"{SVG}rect[@class='span serving']")
    assert [_title(r) for r in serving] == [
        "llm serving: 20:26:45Z → 20:26:48Z (3s); up to 1 in flight, 1 served",
        "llm serving: 20:27:00Z → 20:27:04Z (4s); up to 2 in flight, 2 served",
    ]
    [loading] = llm.findall(f"{SVG}rect[@class='span loading']")
    assert _title(loading) == "llm loading: 20:26:40Z → 20:26:45Z (5s)"
    [loaded] = llm.findall(f"{SVG}rect[@class='span loaded']")
    assert _title(loaded) == "llm loaded: 20:26:45Z → now"
    # Serving is drawn inside the loaded bar, the loaded bar reaches the now line.
    [now] = root.findall(f"{SVG}g[@class='now']")
    now_line = now.find(f"{SVG}line")
    assert now_line is not None
    now_x = float(now_line.get("x1", "nan"))
    assert float(loaded.get("x", "0")) + float(loaded.get("width", "0")) == pytest.approx(now_x)
    [held] = llm.findall(f"{SVG}g[@class='held']")
    assert held.get("data-count") == "1"
    assert _title(held) == "1 held request(s) for llm (web), not before 20:41:40Z"
    [window] = lanes[1].findall(f"{SVG}g[@class='window announced']")
    assert window.get("data-id") == "A"
    text = window.find(f"{SVG}text")
    assert text is not None and text.text == "news-llm ×3 · radio"
    assert "20:56:54Z → 21:06:54Z" in _title(window)
    assert "nothing loaded" in "".join(rows[1].itertext())
    assert _title(now_line) == "now: 20:27:04Z"
    legend = "".join(root.find(f"{SVG}g[@class='legend']").itertext())  # type: ignore[union-attr]
    for words in ("loading", "loaded, idle", "serving", "announced window", "held request"):
        assert words in legend


async def test_the_past_shown_grows_with_the_activity_up_to_the_hour(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as y:
        await a_busy_quarter_hour(y.engine)
        await trio.sleep(1500 - trio.current_time())
        at_25_min = y.observer.timeline(wall_now=EPOCH + 1500)
        await trio.sleep(3000)
        later = y.observer.timeline(wall_now=EPOCH + 4500)
    assert at_25_min["now"] - at_25_min["start"] == 1500  # back to the first load, at 0
    assert later["now"] - later["start"] == 3600  # never more than the history's hour


async def test_without_work_ahead_the_picture_keeps_a_small_margin_after_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as y:
        document = y.observer.timeline(wall_now=EPOCH)
    assert document["now"] - document["start"] == PAST_MIN_S
    assert document["end"] - document["now"] == PAST_MIN_S / 6 < AHEAD_MIN_S
    root = _parse(render_svg(document))
    assert [r.get("data-row") for r in root.findall(f"{SVG}g[@class='device']")] == [
        "gpu0",
        "host",
    ]


async def test_the_dashboard_shows_the_timeline_and_admin_serves_it_as_json(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(admin_key=ADMIN_KEY) as y:
        await a_busy_quarter_hour(y.engine)
        client = y.app.test_client()
        refused = await client.get("/admin/timeline", scope_base=REMOTE)
        assert refused.status_code == 401
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        answer = await client.get("/admin/timeline", headers=auth, scope_base=LOOPBACK)
        assert answer.status_code == 200
        body = await answer.get_json()
        assert [lane["backend"] for lane in body["devices"][0]["lanes"]] == ["llm", "news"]
        page = await (await client.get("/dashboard", headers=auth)).get_data(as_text=True)
    section = page[page.index('<section id="timeline"') :]
    svg = section[section.index("<svg") : section.index("</svg>") + len("</svg>")]
    root = _parse(svg)
    assert root.find(f".//{SVG}g[@data-id='A']") is not None


async def test_a_watcher_that_raises_is_dropped_and_the_engine_goes_on(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[float, str]] = []

    def broken(at: float, item: object) -> None:
        raise RuntimeError("a bug in a watcher")

    async with running() as y:
        y.engine.watch(broken)
        y.engine.watch(lambda at, item: seen.append((at, type(item).__name__)))
        admission = y.engine.submit(backend="llm", priority=50, request_id="a")
        await admission.wait_dispatched()
        assert trio.current_time() == 5.0
    kinds = {"RequestArrived", "StartBackend", "BackendReady", "Dispatch"}
    assert [(at, kind) for at, kind in seen if kind in kinds] == [
        (0.0, "RequestArrived"),
        (0.0, "StartBackend"),
        (5.0, "BackendReady"),
        (5.0, "Dispatch"),
    ]
    assert "a watcher of the engine failed; it is dropped" in caplog.text


async def test_backends_started_before_the_observer_are_taken_from_the_log_and_snapshot(
    engine: FakeEngine, autojump_clock: trio.testing.MockClock
) -> None:
    # The fixture's llm is ready since 0.0; its load was decided at -12.5.
    engine.log.append(
        LoggedDecision(
            at=-12.5, decision=StartBackend(reason="pinned", backend="llm", gpus=("gpu0",))
        )
    )
    await trio.sleep(60)
    observer = Observer(engine=engine, models={"llm": ("tiny-llm",)})
    document = observer.timeline(wall_now=EPOCH)
    lanes = {d["name"]: d["lanes"] for d in document["devices"]}
    assert lanes["host"] == []
    [llm] = lanes["gpu0"]
    assert [(s["kind"], s["start"], s["end"]) for s in llm["spans"]] == [
        ("loading", -12.5, 0.0),
        ("loaded", 0.0, None),
    ]


def _announced(wid: str, app: str, opens: float, closes: float) -> WindowView:
    return WindowView(
        id=wid,
        kind="announced",
        app=app,
        backend="news",
        opens=opens,
        closes=closes,
        priority=70.0,
        left=2,
        loads_from=opens - 40.0,
        label="",
    )


def test_overlapping_windows_are_stacked_and_names_are_escaped() -> None:
    snapshot = Snapshot(
        now=0.0,
        devices=(),
        backends=(),
        queue=(),
        queue_length=0,
        windows=(
            _announced("A", "radio", 600.0, 1200.0),
            _announced("B", "<b>evil</b>", 900.0, 1500.0),
            _announced("C", "radio", 8000.0, 9000.0),  # past the 2 h the picture shows
        ),
    )
    document = build(History(), snapshot, models={"news": ("news-llm",)}, wall_now=EPOCH)
    assert document["end"] == 1500.0  # the furthest shown window, in 5-minute steps
    assert document["beyond"] == 1
    root = _parse(render_svg(document))
    windows = root.findall(f".//{SVG}g[@class='window announced']")
    assert [w.get("data-id") for w in windows] == ["A", "B"]
    boxes = [w.find(f"{SVG}rect") for w in windows]
    ys = [float(b.get("y", "nan")) for b in boxes if b is not None]
    assert ys[0] != ys[1]  # one above the other, so their labels do not overlap
    labels = [w.find(f"{SVG}text") for w in windows]
    assert [t.text for t in labels if t is not None] == [
        "news-llm ×2 · radio",
        "news-llm ×2 · <b>evil</b>",
    ]

from __future__ import annotations

import json
import re

import pytest
import trio
from quart_trio import QuartTrio

from tests.observe.conftest import ADMIN_KEY, LOOPBACK, REMOTE, make_app, open_stream
from yard.core.decisions import Dispatch, StartBackend
from yard.observe import Observer, auth
from yard.observe.dashboard import (
    COALESCE_S,
    MIN_INTERVAL_S,
    SECTIONS,
    format_bytes,
    format_duration,
)
from yard.testing.engine import FakeEngine, GiB, queued_view


def _sections(raw: bytes) -> list[dict[str, str]]:
    """The ``section`` events of a server-sent event stream, in order."""
    found = []
    for block in raw.decode().split("\n\n"):
        lines = block.split("\n")
        if "event: section" in lines:
            data = next(line for line in lines if line.startswith("data: "))
            found.append(json.loads(data.removeprefix("data: ")))
    return found


async def test_dashboard_asks_for_the_admin_key_and_the_login_sets_a_cookie(
    app: QuartTrio,
) -> None:
    client = app.test_client()
    first = await client.get("/dashboard", scope_base=REMOTE)
    assert first.status_code == 401
    assert 'name="key"' in await first.get_data(as_text=True)
    wrong = await client.post("/dashboard/login", form={"key": "nope"}, scope_base=REMOTE)
    assert wrong.status_code == 401
    assert "wrong admin key" in await wrong.get_data(as_text=True)
    right = await client.post("/dashboard/login", form={"key": ADMIN_KEY}, scope_base=REMOTE)
    assert right.status_code == 303
    assert right.headers["Location"] == "/dashboard"
    cookie = right.headers["Set-Cookie"]
    assert cookie.startswith(f"{auth.COOKIE}=")
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert ADMIN_KEY not in cookie
    page = await client.get("/dashboard", scope_base=REMOTE)
    assert page.status_code == 200
    html = await page.get_data(as_text=True)
    for name in SECTIONS:
        assert f'id="{name}"' in html
    assert 'data-backend="llm" data-state="ready"' in html
    assert "dashboard.js" in html


async def test_the_cookie_alone_cannot_press_buttons_for_another_site(
    app: QuartTrio, engine: FakeEngine
) -> None:
    client = app.test_client()
    login = await client.post("/dashboard/login", form={"key": ADMIN_KEY}, scope_base=REMOTE)
    assert login.status_code == 303
    forged = await client.post("/admin/backends/llm/unload", scope_base=REMOTE)
    assert forged.status_code == 403
    assert (await forged.get_json())["error"]["code"] == "admin_header_required"
    assert engine.sent == []
    pressed = await client.post(
        "/admin/backends/llm/unload", headers={auth.CSRF_HEADER: "1"}, scope_base=REMOTE
    )
    assert pressed.status_code == 202
    assert len(engine.sent) == 1


async def test_without_an_admin_key_the_dashboard_is_for_loopback_only(
    engine: FakeEngine,
) -> None:
    client = make_app(engine, admin_key=None).test_client()
    assert (await client.get("/dashboard", scope_base=REMOTE)).status_code == 403
    assert (await client.get("/dashboard/events", scope_base=REMOTE)).status_code == 403
    assert (await client.get("/dashboard", scope_base=LOOPBACK)).status_code == 200


async def test_memory_bar_shows_reservation_and_live_use(app: QuartTrio) -> None:
    client = app.test_client()
    html = await (
        await client.get("/dashboard", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    ).get_data(as_text=True)
    gpu = html[html.index('data-device="gpu0"') :]
    segment = re.search(r'<div class="seg backend state-ready" data-backend="llm"[^>]*>', gpu)
    assert segment is not None
    # Reserved 4 GiB x 1.25 = 5 GiB of 24 GiB; 3 GiB of it in live use.
    assert "width: 20.83%" in segment.group(0)
    assert 'data-live="3221225472"' in segment.group(0)
    assert 'class="live-fill" style="width: 60.00%"' in gpu
    assert "2.0 GiB foreign" in gpu


async def test_event_stream_sends_changed_sections_right_after_a_decision(
    app: QuartTrio, engine: FakeEngine, autojump_clock: trio.abc.Clock
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with open_stream(app, "/dashboard/events", headers=headers) as stream:
        first = _sections(await stream.read_until(b'"id": "failures"'))
        assert [s["id"] for s in first] == list(SECTIONS)
        assert "Nobody is waiting." in first[SECTIONS.index("queue")]["html"]
        await trio.sleep(0.3)
        engine.queue.append(queued_view("req-42", "tts", app="radio", reason="tts is loading"))
        engine.set_backend("tts", state="starting", reason="asked for by req-42")
        t0 = trio.current_time()
        engine.decide(StartBackend(reason="req-42 needs tts", backend="tts"))
        raw = await stream.read_until(b"req-42 needs tts")
        assert trio.current_time() - t0 == pytest.approx(COALESCE_S)
        update = {s["id"]: s["html"] for s in _sections(raw)[len(first) :]}
        assert {"queue", "decisions", "backends"} <= update.keys()
        assert 'data-request-id="req-42"' in update["queue"]
        assert "tts is loading" in update["queue"]
        assert "radio" in update["queue"]
        assert 'data-backend="tts" data-state="starting"' in update["backends"]

        engine.queue.clear()
        engine.decide(Dispatch(reason="tts is ready", request_id="req-42", backend="tts"))
        raw = await stream.read_until(b"tts is ready")
        later = {s["id"]: s["html"] for s in _sections(raw)}
        assert (
            'class="decision kind-dispatch" data-kind="dispatch" data-request-id="req-42"'
            in (later["decisions"])
        )


async def test_without_decisions_the_stream_refreshes_every_second(
    app: QuartTrio, engine: FakeEngine, autojump_clock: trio.abc.Clock
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with open_stream(app, "/dashboard/events", headers=headers) as stream:
        await stream.read_until(b'"id": "failures"')
        t0 = trio.current_time()
        engine.devices[1] = engine.devices[1].__class__(
            name="gpu0",
            kind="gpu",
            total_bytes=24 * GiB,
            reserve_bytes=GiB,
            committed_bytes=5 * GiB,
            live_bytes={"llm": 4 * GiB},
            free_bytes=15 * GiB,
        )
        await stream.read_until(b"15.0 GiB free")
        assert trio.current_time() - t0 == pytest.approx(1.0)


def test_sizes_and_durations_read_well() -> None:
    assert format_bytes(None) == "-"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(5 * GiB) == "5.0 GiB"
    assert format_duration(None) == "-"
    assert format_duration(2.345) == "2.3s"
    assert format_duration(75) == "1m15s"
    assert format_duration(7322) == "2h02m"


async def test_streams_end_within_a_second_once_yard_is_stopping(
    engine: FakeEngine, autojump_clock: trio.abc.Clock
) -> None:
    stopping = trio.Event()
    app = make_app(engine, admin_key=None)
    app.extensions[Observer.KEY].shutdown = stopping
    async with app.test_client().request("/dashboard/events", scope_base=LOOPBACK) as connection:
        await connection.send_complete()
        received = b""
        while b'"id": "failures"' not in received:
            received += await connection.receive()
        t0 = trio.current_time()
        await trio.sleep(0.5)
        stopping.set()
        with pytest.raises(trio.EndOfChannel):
            while True:
                received += await connection.receive()
        # The stream noticed at its next refresh and ended its body.
        assert trio.current_time() - t0 == pytest.approx(1.0)
    assert len(_sections(received)) == len(SECTIONS)


async def test_backend_output_is_escaped_on_the_page(app: QuartTrio, engine: FakeEngine) -> None:
    engine.set_backend("tts", state="failed", reason="exited: <b>bad</b>")
    engine.logs["tts"] = ["<script>alert('owned')</script>"]
    page = await app.test_client().get(
        "/dashboard", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    html = await page.get_data(as_text=True)
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in html
    assert "exited: &lt;b&gt;bad&lt;/b&gt;" in html


async def test_a_busy_engine_gets_at_most_four_renders_a_second(
    app: QuartTrio, engine: FakeEngine, autojump_clock: trio.abc.Clock
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with open_stream(app, "/dashboard/events", headers=headers) as stream:
        await stream.read_until(b'"id": "failures"')
        await trio.sleep(0.3)
        t0 = trio.current_time()
        engine.decide(StartBackend(reason="first load", backend="tts"))
        await stream.read_until(b"first load")
        assert trio.current_time() - t0 == pytest.approx(COALESCE_S)
        await trio.sleep(0.05)
        engine.decide(StartBackend(reason="second load", backend="tts"))
        await stream.read_until(b"second load")
        # The previous render was at t0 + 0.05; the next waits for t0 + 0.05 + 0.25.
        assert trio.current_time() - t0 == pytest.approx(COALESCE_S + MIN_INTERVAL_S)


async def test_a_single_yard_page_reads_without_guessing(
    app: QuartTrio, engine: FakeEngine
) -> None:
    # Issue 24 case 7: ids told apart, no empty nodes box, a legend for the
    # hatches, an icon (the browser asked for /favicon.ico and got a 404).
    for n in (0xA1F, 0xB20):
        engine.queue.append(queued_view(f"c768734d7003{n:012x}", "llm", app="radio"))
    client = app.test_client()
    html = await (
        await client.get("/dashboard", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    ).get_data(as_text=True)
    assert "…000000000a1f" in html and "…000000000b20" in html
    assert 'title="c768734d7003000000000a1f"' in html
    assert re.search(r'<section id="nodes" hidden>\s*</section>', html)
    assert "foreign: used by processes yard does not own" in html
    assert "kept free: the device's reserve" in html
    assert '<link rel="icon" href="data:image/svg+xml,' in html

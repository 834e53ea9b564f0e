"""The real gateway (``yard serve``, a real test backend process that takes
1.5 s to load, loopback sockets): a request arriving in an announced window
finds its backend ready; without the announcement it waits for the load."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.gateway.conftest import backend_toml, running_yard, wait_until

pytestmark = pytest.mark.slow

LOAD_S = 1.5

BODY = (
    backend_toml("news", models=("news-llm",), switches={"load_time": LOAD_S})
    # stopped after 1 s idle, unless announced work keeps it
    + "idle_ttl_s = 1\n"
    + """
[apps.radio]
key = "sk-radio"
default_priority = 50
max_priority = 90
"""
)

CHAT = {"model": "news-llm", "messages": [{"role": "user", "content": "the news"}]}


async def _queue_ms(client: httpx.AsyncClient) -> float:
    answer = await client.post("/v1/chat/completions", json=CHAT)
    assert answer.status_code == 200, answer.text
    return float(answer.headers["x-yard-queue-ms"])


async def test_a_request_in_an_announced_window_finds_its_backend_ready(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with (
            running_yard(tmp_path, BODY) as runtime,
            httpx.AsyncClient(
                base_url=runtime.urls[0],
                headers={"authorization": "Bearer sk-radio"},
                timeout=30,
            ) as client,
        ):

            def state() -> str:
                backends = runtime.parts.engine.snapshot(limit=0).backends
                return next(b.state for b in backends if b.name == "news")

            # Without an announcement: the request waits for the load (the
            # first one is also measured), and again once news was stopped.
            cold = [await _queue_ms(client)]
            await wait_until(lambda: state() == "stopped")
            cold.append(await _queue_ms(client))
            await wait_until(lambda: state() == "stopped")

            # Announced: the window opens in 6 s; news loads ahead (at the
            # window minus its measured load time minus 2 s) and is kept past
            # its idle_ttl_s for the window.
            made = await client.post(
                "/v1/announcements",
                json={"model": "news-llm", "start_after": 6, "window_s": 60, "count": 2},
            )
            assert made.status_code == 201, made.text
            announcement = made.json()["id"]
            await trio.sleep(6.2)
            assert state() == "ready"
            warm = [await _queue_ms(client)]
            await trio.sleep(2)  # past idle_ttl_s: still kept for the announced work
            assert state() == "ready"
            warm.append(await _queue_ms(client))
            shown = (await client.get(f"/v1/announcements/{announcement}")).json()
            metrics = (await client.get("/metrics")).text
            # A time window on a synchronous request: it waits, held, until it opens.
            held = await client.post(
                "/v1/chat/completions", json=CHAT, headers={"x-yard-start-after": "1.5"}
            )
            both = await client.post(
                "/v1/chat/completions",
                json=CHAT,
                headers={"x-yard-start-after": "1", "x-yard-not-before": "2026-12-03T13:50:00Z"},
            )

    print(f"X-Yard-Queue-Ms without announcement {cold}, inside the announced window {warm}")
    assert min(cold) > LOAD_S * 1000
    assert max(warm) < 50
    assert (shown["status"], shown["used"]) == ("used", 2)
    assert 'yard_announcements_total{app="radio",outcome="used"} 1.0' in metrics
    assert held.status_code == 200
    # held 1.5 s from when the header was read, a moment before the request was queued
    assert float(held.headers["x-yard-queue-ms"]) >= 1450
    assert both.status_code == 400
    assert both.json()["error"]["code"] == "invalid_window"

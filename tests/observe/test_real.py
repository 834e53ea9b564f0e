"""The dashboard, /metrics and ``yard status`` against a real yard (``yard.app.serve``
in this process, real test-backend processes, loopback sockets), the dashboard
in a real browser: Playwright driving Debian's chromium (``make browser``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio
from playwright.sync_api import sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import backend_toml, running_yard

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
ADMIN_KEY = "dashboard-admin"
APP_KEY = "tester-key"
CONFIG = f"""admin_key = "{ADMIN_KEY}"

[apps.tester]
key = "{APP_KEY}"
default_priority = 60
max_priority = 90

"""
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}
LLM_IS_LIVE = """() => {
  const seg = document.querySelector('#memory .seg.backend[data-backend="llm"]');
  return seg !== null && Number(seg.dataset.live) > 0;
}"""


def _browse(url: str, page_is_live: Callable[[], None], screenshot: Path) -> dict[str, object]:
    """Log in, wait for the live feed, let the test send a request, and watch
    it go through the queue and the decisions, without reloading the page."""
    seen: dict[str, object] = {}
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make browser`"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            failed: list[str] = []
            page.on(
                "response",
                lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None,
            )
            seen["failed"] = failed
            page.goto(f"{url}/dashboard")
            page.fill("#key", ADMIN_KEY)
            page.click("button[type=submit]")
            page.wait_for_selector("#live[data-state=live]", timeout=15_000)
            page.evaluate("window.yardNotReloaded = true")
            seen["nodes_visible"] = page.is_visible("#nodes")
            seen["llm_bar_before"] = page.locator(
                '#memory .seg.backend[data-backend="llm"]'
            ).count()
            page_is_live()
            row = page.wait_for_selector("#queue tr[data-request-id]", timeout=15_000)
            assert row is not None
            request_id = row.get_attribute("data-request-id")
            seen["queued_id"] = request_id
            seen["queued_row"] = row.inner_text()
            seen["queued_reason"] = page.inner_text(
                f'#queue tr[data-request-id="{request_id}"] .reason'
            )
            page.screenshot(path=str(screenshot.with_name("dashboard-queued.png")), full_page=True)
            page.wait_for_selector(
                f'#decisions li.kind-dispatch[data-request-id="{request_id}"]', timeout=30_000
            )
            page.wait_for_function(LLM_IS_LIVE, timeout=15_000)
            seen["llm_state"] = page.get_attribute('#backends tr[data-backend="llm"]', "data-state")
            page.click('button[data-action="pin"][data-backend="llm"]')
            page.wait_for_selector('#backends tr[data-backend="llm"] .pill', timeout=10_000)
            seen["pinned"] = page.inner_text('#backends tr[data-backend="llm"] .pill')
            page.screenshot(path=str(screenshot), full_page=True)
            page.click('button[data-action="log"][data-backend="llm"]')
            page.wait_for_function(
                "() => document.getElementById('log-lines').textContent.includes('ready')",
                timeout=10_000,
            )
            seen["log"] = page.inner_text("#log-lines")
            seen["not_reloaded"] = page.evaluate("window.yardNotReloaded === true")
        finally:
            browser.close()
    return seen


async def test_dashboard_shows_a_request_queue_then_dispatch_live_in_a_browser(
    tmp_path: Path,
) -> None:
    body = CONFIG + backend_toml(
        "llm", models=("tiny",), switches={"load_time": 2.0, "memory": "64MiB"}
    )
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "dashboard.png"
    answer: dict[str, str | int] = {}
    with trio.fail_after(120):
        async with running_yard(tmp_path, body) as runtime:
            url = runtime.urls[0]
            page_is_live = trio.Event()

            async def ask() -> None:
                await page_is_live.wait()
                async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                    response = await client.post(
                        "/v1/chat/completions",
                        json=CHAT,
                        headers={"Authorization": f"Bearer {APP_KEY}"},
                    )
                answer["status"] = response.status_code
                answer["id"] = response.headers["x-yard-request-id"]

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                seen = await trio.to_thread.run_sync(
                    _browse,
                    url,
                    lambda: trio.from_thread.run_sync(page_is_live.set),
                    screenshot,
                )

            status = await trio.run_process(
                [sys.executable, "-m", "yard.cli", "status", "--url", url, "--key", ADMIN_KEY],
                capture_stdout=True,
                capture_stderr=True,
            )
    assert answer["status"] == 200
    assert seen["llm_bar_before"] == 0
    assert seen["queued_id"] == answer["id"]
    assert "tester" in str(seen["queued_row"])
    assert str(seen["queued_reason"]).strip()  # the core's reason for the wait
    assert seen["llm_state"] in ("ready", "busy")
    assert seen["pinned"] == "pinned"
    assert "listening on http://127.0.0.1:" in str(seen["log"])
    assert seen["not_reloaded"] is True
    assert seen["nodes_visible"] is False  # one yard: no empty nodes box
    # Nothing the page asked for failed (the browser's favicon request was a 404);
    # the login page's 401 is the only refusal.
    assert [f for f in seen["failed"] if not f.startswith("401 ")] == []  # type: ignore[attr-defined]
    assert screenshot.stat().st_size > 10_000
    printed = status.stdout.decode()
    assert "host-only mode" in printed or "gpu" in printed
    assert "llm" in printed
    assert "dispatch" in printed


def _counters(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_counters_move_as_a_real_yard_serves_requests(tmp_path: Path) -> None:
    body = backend_toml("llm", models=("tiny",), switches={"load_time": 0.2})
    with trio.fail_after(60):
        async with running_yard(tmp_path, body) as runtime:
            client = httpx.AsyncClient(base_url=runtime.urls[0], timeout=30)
            async with client:
                before = _counters((await client.get("/metrics")).text)
                for _ in range(2):
                    served = await client.post("/v1/chat/completions", json=CHAT)
                    assert served.status_code == 200
                after = _counters((await client.get("/metrics")).text)
    ok = ("yard_requests_ended_total", (("outcome", "ok"),))
    dispatch = ("yard_decisions_total", (("backend", "llm"), ("kind", "dispatch")))
    assert after[ok] - before.get(ok, 0) == 2
    assert after[dispatch] - before.get(dispatch, 0) == 2
    assert after[("yard_loads_total", ())] - before[("yard_loads_total", ())] == 1
    assert after[("yard_load_seconds_count", (("backend", "llm"),))] == 1
    assert after[("yard_backend_state", (("backend", "llm"), ("state", "ready")))] == 1


async def test_a_crashed_backend_shows_as_a_failure_with_its_last_log_lines(
    tmp_path: Path,
) -> None:
    body = CONFIG + backend_toml("llm", models=("tiny",), switches={"crash_after": 0})
    with trio.fail_after(60):
        async with running_yard(tmp_path, body) as runtime:
            client = httpx.AsyncClient(base_url=runtime.urls[0], timeout=30)
            async with client:
                failed = await client.post(
                    "/v1/chat/completions",
                    json=CHAT,
                    headers={"Authorization": f"Bearer {APP_KEY}"},
                )
                status = (
                    await client.get(
                        "/admin/status", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
                    )
                ).json()
    assert failed.status_code == 502
    request_id = failed.headers["x-yard-request-id"]
    failure = next(f for f in status["failures"] if f["request_id"] == request_id)
    assert failure["backend"] == "llm"
    assert failure["code"] == "backend_failed"
    assert any("listening on http://127.0.0.1:" in line for line in failure["log"])

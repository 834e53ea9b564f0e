"""What a start got within its ranges (context, parallel slots), and whether the
meter tells backends apart on each device, show in the status document,
``yard status``, the dashboard's backends and ``/metrics``."""

from __future__ import annotations

from quart_trio import QuartTrio
from rich.console import Console

from tests.observe.conftest import ADMIN_KEY, make_app
from tests.observe.test_metrics import scrape
from yard.observe import Observer, install
from yard.testing.engine import FakeEngine, device_view


def _printed(status: dict[str, object]) -> str:
    from yard.status import render

    console = Console(record=True, width=240, color_system=None)
    render(status, console)
    return console.export_text()


async def test_the_context_and_slots_a_start_got_are_shown(engine: FakeEngine) -> None:
    engine.set_backend("llm", context=16384, parallel=4, slots=4)
    observer = Observer(engine=engine, profile_margin=1.25)
    status = observer.status()
    [llm] = [b for b in status["backends"] if b["name"] == "llm"]
    assert (llm["context"], llm["parallel"], llm["slots"]) == (16384, 4, 4)
    [tts] = [b for b in status["backends"] if b["name"] == "tts"]
    assert tts["parallel"] is None
    text = _printed(status)
    assert "ready context 16384 parallel 4" in text
    assert "0/4" in text


async def test_a_gpu_credited_by_device_deltas_is_shown(engine: FakeEngine) -> None:
    engine.devices.append(device_view("gpu1", per_process=True))
    observer = Observer(engine=engine, profile_margin=1.25)
    status = observer.status()
    by_name = {d["name"]: d["per_process"] for d in status["devices"]}
    assert (by_name["gpu0"], by_name["gpu1"]) == (False, True)
    text = _printed(status)
    assert text.count("(device deltas: first loads alone)") == 1
    app = QuartTrio(__name__)
    install(app, observer)
    samples = await scrape(app)
    assert samples[("yard_device_per_process", (("device", "gpu0"), ("kind", "gpu")))] == 0
    assert samples[("yard_device_per_process", (("device", "gpu1"), ("kind", "gpu")))] == 1


async def test_the_dashboard_shows_the_slots_and_a_gpu_credited_by_deltas(
    engine: FakeEngine,
) -> None:
    engine.set_backend("llm", context=16384, parallel=4, slots=4)
    engine.devices.append(device_view("gpu1", per_process=True))
    client = make_app(engine).test_client()
    html = await (
        await client.get("/dashboard", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    ).get_data(as_text=True)
    row = html[html.index('data-backend="llm" data-state') :]
    assert "context 16384" in row[:800] and "parallel 4" in row[:800]
    gpu0 = html[html.index('data-device="gpu0"') : html.index('data-device="gpu1"')]
    assert "by device deltas: new backends are measured alone" in gpu0
    assert "device deltas" not in html[html.index('data-device="gpu1"') :]

"""Which memory meter yard uses shows in ``yard status`` and ``/metrics``."""

from __future__ import annotations

from quart_trio import QuartTrio
from rich.console import Console

from tests.observe.test_metrics import scrape
from yard.observe import MeterInfo, Observer, install
from yard.testing.engine import FakeEngine

DETAIL = "GPUs metered through the kernel's DRM interface (fdinfo, sysfs): gpu0 (RX 7900)"


def _observer(engine: FakeEngine, meter: str | None = None) -> Observer:
    info = None if meter is None else MeterInfo(mode=meter, detail=DETAIL)
    return Observer(engine=engine, profile_margin=1.25, meter_info=info)


async def test_the_status_document_and_yard_status_name_the_meter(engine: FakeEngine) -> None:
    from yard.status import render

    status = _observer(engine, meter="drm").status()
    assert status["meter"] == {"mode": "drm", "detail": DETAIL}
    console = Console(record=True, width=300, color_system=None)
    render(status, console)
    assert f"memory meter (drm): {DETAIL}" in console.export_text()


async def test_without_a_meter_nothing_is_claimed(engine: FakeEngine) -> None:
    assert "meter" not in _observer(engine).status()


async def test_metrics_name_the_meter(engine: FakeEngine) -> None:
    app = QuartTrio(__name__)
    install(app, _observer(engine, meter="nvml+drm"))
    samples = await scrape(app)
    assert samples[("yard_meter_info", (("detail", DETAIL), ("mode", "nvml+drm")))] == 1

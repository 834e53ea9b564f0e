"""Each app's limits, its waiting and served requests and its refusals show
in the status document, ``yard status``, the dashboard and ``/metrics``."""

from __future__ import annotations

import pathlib
from typing import cast

from quart_trio import QuartTrio
from rich.console import Console

from tests.observe.conftest import ADMIN_KEY
from tests.observe.test_metrics import scrape
from yard.config import load_config
from yard.engine import Engine
from yard.observe import Observer, install
from yard.testing.engine import FakeEngine, statistics

LIMITS: dict[str, dict[str, object]] = {
    "radio": {"models": ["voice*"], "max_queued": 2, "max_concurrent": None, "weight": 2.0},
    "chat": {"models": None, "max_queued": None, "max_concurrent": None, "weight": 1.0},
}


def _observer(engine: FakeEngine) -> Observer:
    engine.stats = statistics(
        queued_by_app={"radio": 2, "local": 1},
        inflight_by_app={"radio": 1},
        refusals={"radio": {"app_queue_full": 3, "deadline_missed": 1}},
    )
    return Observer(engine=engine, profile_margin=1.25, admin_key=ADMIN_KEY, apps=LIMITS)


async def test_the_status_document_lists_each_apps_limits_and_counts(engine: FakeEngine) -> None:
    assert _observer(engine).status()["apps"] == [
        {
            "name": "radio",
            **LIMITS["radio"],
            "queued": 2,
            "inflight": 1,
            "refused": {"app_queue_full": 3, "deadline_missed": 1},
        },
        {"name": "chat", **LIMITS["chat"], "queued": 0, "inflight": 0, "refused": {}},
        # Seen by the engine, not configured (no app keys): no limits.
        {"name": "local", "queued": 1, "inflight": 0, "refused": {}},
    ]


async def test_yard_status_shows_the_apps_table(engine: FakeEngine) -> None:
    from yard.status import render

    console = Console(record=True, width=200, color_system=None)
    render(_observer(engine).status(), console)
    lines = [line.split() for line in console.export_text().splitlines()]
    assert ["radio", "2/2", "1", "2", "app_queue_full", "3,", "deadline_missed", "1", "voice*"] in [
        [word for word in line if word != "│"] for line in lines
    ]


async def test_the_dashboard_shows_the_apps(engine: FakeEngine) -> None:
    app = QuartTrio(__name__)
    install(app, _observer(engine))
    html = await (
        await app.test_client().get("/dashboard", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    ).get_data(as_text=True)
    row = html[html.index('<tr data-app="radio">') :]
    row = row[: row.index("</tr>")]
    cells = [cell.split("</td>")[0].strip() for cell in row.split("<td>")[1:]]
    assert cells == ["radio", "2 / 2", "1", "2", "app_queue_full 3, deadline_missed 1", "voice*"]


async def test_metrics_count_refusals_by_app_and_reason(engine: FakeEngine) -> None:
    app = QuartTrio(__name__)
    install(app, _observer(engine))
    samples = await scrape(app)
    refusals = {
        labels: value for (name, labels), value in samples.items() if name == "yard_refusals_total"
    }
    assert refusals == {
        (("app", "radio"), ("reason", "app_queue_full")): 3,
        (("app", "radio"), ("reason", "deadline_missed")): 1,
    }
    assert samples[("yard_app_queued", (("app", "radio"),))] == 2
    assert samples[("yard_app_inflight", (("app", "radio"),))] == 1


async def test_the_limits_come_from_the_configuration(
    engine: FakeEngine, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "yard.toml"
    path.write_text(
        '[backends.tts]\nmodels = ["voice-a"]\ncommand = ["x"]\n'
        "[apps.radio]\nkey = 'k'\nmodels = ['voice*']\nmax_queued = 2\nweight = 2\n"
        "[apps.chat]\nkey = 'k2'\nmax_concurrent = 4\n"
    )
    config = load_config(path, env={})
    assert Observer.from_config(config, engine=cast(Engine, engine)).apps == {
        "radio": {"models": ["voice*"], "max_queued": 2, "max_concurrent": None, "weight": 2.0},
        "chat": {"models": None, "max_queued": None, "max_concurrent": 4, "weight": 1.0},
    }

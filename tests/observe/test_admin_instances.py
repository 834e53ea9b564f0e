"""The admin API on a backend with several instances: ``/admin/backends/news/...``
acts on every instance (or loads one more), ``news@2`` on one."""

from __future__ import annotations

import pytest
from quart_trio import QuartTrio

from tests.observe.conftest import ADMIN_KEY, make_app
from yard.core.events import AdminLoad, AdminPin, AdminUnload
from yard.core.spec import Profile
from yard.testing.engine import FakeEngine

BEARER = {"Authorization": f"Bearer {ADMIN_KEY}"}
PROFILE = Profile(gpu_bytes=2**30, host_bytes=2**30, load_s=10.0)


@pytest.fixture
def news() -> FakeEngine:
    """news ready, news@2 draining, news@3 stopped; one profile for all."""
    fake = FakeEngine()
    fake.set_backend("news@3", profile=PROFILE)
    fake.set_backend("news", state="ready", profile=PROFILE)
    fake.set_backend("news@2", state="draining", profile=PROFILE)
    return fake


@pytest.fixture
def app(news: FakeEngine) -> QuartTrio:
    return make_app(news)


async def test_unload_by_name_unloads_every_instance_and_lists_them(
    app: QuartTrio, news: FakeEngine
) -> None:
    response = await app.test_client().post("/admin/backends/news/unload", headers=BEARER)
    assert response.status_code == 202
    assert await response.get_json() == {
        "backend": "news",
        "state": "ready",
        "pinned": False,
        "action": "unload",
        "accepted": True,
        "instances": [
            {"backend": "news", "state": "ready", "pinned": False},
            {"backend": "news@2", "state": "draining", "pinned": False},
        ],
        "detail": "unloading every instance of news loaded or loading: news, news@2",
    }
    assert news.sent == [AdminUnload(backend="news"), AdminUnload(backend="news@2")]


async def test_load_by_name_loads_the_first_instance_not_loaded(
    app: QuartTrio, news: FakeEngine
) -> None:
    response = await app.test_client().post("/admin/backends/news/load", headers=BEARER)
    assert response.status_code == 202
    body = await response.get_json()
    assert body["instances"] == [{"backend": "news@3", "state": "stopped", "pinned": False}]
    assert body["detail"] == "loading news@3, the first instance of news not loaded: news@3"
    assert news.sent == [AdminLoad(backend="news@3")]


async def test_an_action_with_nothing_to_do_says_so(app: QuartTrio, news: FakeEngine) -> None:
    news.set_backend("news@3", state="starting")
    response = await app.test_client().post("/admin/backends/news/load", headers=BEARER)
    assert response.status_code == 200
    body = await response.get_json()
    assert body["accepted"] is False and body["instances"] == []
    assert body["detail"] == "every instance of news (news, news@2, news@3) is loaded or loading"
    assert news.sent == []


async def test_pin_by_name_pins_every_instance(app: QuartTrio, news: FakeEngine) -> None:
    response = await app.test_client().post("/admin/backends/news/pin", headers=BEARER)
    assert response.status_code == 202
    assert news.sent == [
        AdminPin(backend="news", pinned=True),
        AdminPin(backend="news@2", pinned=True),
        AdminPin(backend="news@3", pinned=True),
    ]


@pytest.mark.parametrize(
    ("name", "sent"), [("news@2", "news@2"), ("news@1", "news"), ("news@3", "news@3")]
)
async def test_one_instance_is_acted_on_by_its_own_name(
    app: QuartTrio, news: FakeEngine, name: str, sent: str
) -> None:
    response = await app.test_client().post(f"/admin/backends/{name}/unload", headers=BEARER)
    assert response.status_code == 202
    body = await response.get_json()
    assert body["backend"] == sent and "instances" not in body
    assert news.sent == [AdminUnload(backend=sent)]


@pytest.mark.parametrize("name", ["news@4", "news@0", "newsy"])
async def test_no_such_instance_is_404(app: QuartTrio, news: FakeEngine, name: str) -> None:
    response = await app.test_client().post(f"/admin/backends/{name}/unload", headers=BEARER)
    assert response.status_code == 404
    assert (await response.get_json())["error"]["code"] == "backend_not_found"
    assert news.sent == []

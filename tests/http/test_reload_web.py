"""``yard reload`` reaches the HTTP side through one door (``Web.use_config``):
the gateway and the key check that the jobs, Batch and announcement APIs
share read the new configuration from the next request on."""

from __future__ import annotations

import dataclasses
from typing import cast

import httpx
import trio

from tests.http.conftest import APPS, make_config
from yard.app.web import Parts, Web, serve_app
from yard.config import AppConfig
from yard.engine import Engine
from yard.testing.engine import FakeEngine

NEW = AppConfig(name="radio", key="key-radio", default_priority=50.0, max_priority=90.0)


async def test_a_reloaded_configuration_reaches_the_gateway_and_the_key_check() -> None:
    engine = FakeEngine()
    parts = Parts(config=make_config(apps=dict(APPS)), engine=cast(Engine, engine))
    web = Web(parts)
    radio = {"authorization": "Bearer key-radio"}
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve_app, web.app, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=binds[0], timeout=10) as client:
            assert (await client.get("/v1/models", headers=radio)).status_code == 401
            assert (await client.get("/v1/announcements", headers=radio)).status_code == 401

            web.use_config(dataclasses.replace(parts.config, apps={**APPS, "radio": NEW}))

            models = await client.get("/v1/models", headers=radio)
            assert models.status_code == 200
            assert {m["id"] for m in models.json()["data"]} >= {"tiny", "whisper-1"}
            # The key check the APIs share knows the app (no announcement
            # service here: the route answers that, after the key passed).
            listed = await client.get("/v1/announcements", headers=radio)
            assert listed.status_code == 501
            assert listed.json()["error"]["code"] == "announcements_unavailable"
        nursery.cancel_scope.cancel()
    parts.pool.close_idle()

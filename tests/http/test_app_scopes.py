"""An app's ``models`` scope on every data-plane route: a model outside it does
not exist for that app (the same 404 as an unknown one), synchronous or as a
job; ``/backends/NAME`` by the backend's models; ``/v1/models`` lists only
the app's models."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.http.conftest import Gateway, GatewayFactory, make_config
from yard.config import AppConfig

GUEST = {"authorization": "Bearer key-guest"}
STUDIO = {"authorization": "Bearer key-studio"}
APPS = {
    # May use one model of llm and the plain backend "music" (by its name).
    "guest": AppConfig(
        name="guest",
        key="key-guest",
        default_priority=50.0,
        max_priority=80.0,
        models=("tiny-a*", "mus?c"),
    ),
    "studio": AppConfig(name="studio", key="key-studio", default_priority=50.0, max_priority=80.0),
}


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


class _Jobs:
    def __init__(self) -> None:
        self.submitted: list[object] = []

    async def submit(self, request: object, *, rerun_safe: bool) -> dict[str, object]:
        self.submitted.append(request)
        return {"id": "job-1", "status": "queued"}


@pytest.fixture
async def scoped(gateway_factory: GatewayFactory) -> AsyncIterator[tuple[Gateway, _Jobs]]:
    jobs = _Jobs()
    gateway = await gateway_factory(config=make_config(apps=APPS), jobs=jobs)
    async with gateway.client:
        yield gateway, jobs


def error(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()["error"]
    return response.status_code, body["code"], body["message"].replace("'", "")


async def test_a_model_outside_the_scope_is_not_found_like_an_unknown_one(
    scoped: tuple[Gateway, _Jobs],
) -> None:
    gw, _ = scoped
    hidden = await gw.client.post("/v1/chat/completions", json=chat("tiny"), headers=GUEST)
    unknown = await gw.client.post("/v1/chat/completions", json=chat("nothing"), headers=GUEST)
    assert error(hidden) == (
        404,
        "model_not_found",
        "the model tiny does not exist in this yard; GET /v1/models lists them",
    )
    assert error(unknown)[2] == error(hidden)[2].replace("tiny", "nothing")
    allowed = await gw.client.post("/v1/chat/completions", json=chat("tiny-alias"), headers=GUEST)
    assert allowed.status_code == 200
    # Another app without a scope reaches every model.
    other = await gw.client.post("/v1/chat/completions", json=chat("tiny"), headers=STUDIO)
    assert other.status_code == 200
    assert [a.backend for a in gw.engine.admissions] == ["llm", "llm"]


async def test_a_job_for_a_model_outside_the_scope_is_not_found_and_not_stored(
    scoped: tuple[Gateway, _Jobs],
) -> None:
    gw, jobs = scoped
    async_guest = {**GUEST, "prefer": "respond-async"}
    hidden = await gw.client.post("/v1/embeddings", json=chat("whisper-1"), headers=async_guest)
    assert error(hidden)[:2] == (404, "model_not_found")
    assert jobs.submitted == []
    allowed = await gw.client.post("/v1/embeddings", json=chat("tiny-alias"), headers=async_guest)
    assert allowed.status_code == 202
    assert len(jobs.submitted) == 1


async def test_backends_route_follows_the_backends_models(scoped: tuple[Gateway, _Jobs]) -> None:
    gw, _ = scoped
    # llm serves tiny-alias, which the guest may use: its own routes are open.
    assert (await gw.client.get("/backends/llm/props", headers=GUEST)).status_code == 200
    # music names no models; "mus?c" matches its name.
    assert (await gw.client.get("/backends/music/x", headers=GUEST)).status_code == 200
    hidden = await gw.client.get("/backends/whisper/x", headers=GUEST)
    unknown = await gw.client.get("/backends/nope/x", headers=GUEST)
    assert error(hidden) == (
        404,
        "backend_not_found",
        "no backend named whisper (configured: llm, music)",
    )
    assert error(unknown)[:2] == (404, "backend_not_found")
    assert "whisper" not in error(unknown)[2]
    assert (await gw.client.get("/backends/whisper/x", headers=STUDIO)).status_code == 200


async def test_models_lists_only_the_apps_models(scoped: tuple[Gateway, _Jobs]) -> None:
    gw, _ = scoped
    listed = await gw.client.get("/v1/models", headers=GUEST)
    assert [m["id"] for m in listed.json()["data"]] == ["tiny-alias"]
    everything = await gw.client.get("/v1/models", headers=STUDIO)
    assert [m["id"] for m in everything.json()["data"]] == ["tiny", "tiny-alias", "whisper-1"]
    assert (await gw.client.get("/v1/models/tiny-alias", headers=GUEST)).status_code == 200
    hidden = await gw.client.get("/v1/models/tiny", headers=GUEST)
    assert error(hidden)[:2] == (404, "model_not_found")


async def test_backends_route_checks_the_model_the_body_names(
    scoped: tuple[Gateway, _Jobs],
) -> None:
    # llm serves tiny (outside the guest's scope) and tiny-alias (inside): the
    # body's model decides, as on /v1, synchronous or as a job.
    gw, jobs = scoped
    path = "/backends/llm/v1/chat/completions"
    hidden = await gw.client.post(path, json=chat("tiny"), headers=GUEST)
    assert error(hidden) == (
        404,
        "model_not_found",
        "the model tiny does not exist in this yard; GET /v1/models lists them",
    )
    as_job = await gw.client.post(
        path, json=chat("tiny"), headers={**GUEST, "prefer": "respond-async"}
    )
    assert error(as_job)[:2] == (404, "model_not_found")
    assert jobs.submitted == []
    # A body that names no model would let the backend choose one.
    unnamed = await gw.client.post(path, json={"messages": []}, headers=GUEST)
    assert error(unnamed)[:2] == (400, "model_required")
    assert gw.engine.admissions == []
    allowed = await gw.client.post(path, json=chat("tiny-alias"), headers=GUEST)
    assert allowed.status_code == 200
    # An app without a scope, or a backend all of whose models are in scope
    # (music, by name), needs no model in the body.
    assert (await gw.client.post(path, json={"messages": []}, headers=STUDIO)).status_code == 200
    assert (
        await gw.client.post("/backends/music/x", content=b"raw", headers=GUEST)
    ).status_code == 200

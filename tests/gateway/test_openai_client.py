"""The official ``openai`` client, at its defaults (two retries), against
``yard serve`` on loopback: yard's refusals reach it after one HTTP try, a
backend whose command fails is started once per call, and a wrong key is an
``openai.AuthenticationError``. (The client retries 408, 409, 429 and 5xx
unless the answer says ``x-should-retry: false``.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from tests.gateway.conftest import backend_toml, running_yard

pytestmark = pytest.mark.slow

KEY = "sk-radio"
APPS = f"""
[apps.radio]
key = "{KEY}"
default_priority = 50
max_priority = 80
"""


def _config(tmp_path: Path) -> str:
    starts = tmp_path / "starts.txt"
    failing = [
        "[backends.broken]",
        f"command = {json.dumps(['sh', '-c', f'echo started >> {starts}; exit 3'])}",
        'models = ["broken-llm"]',
        "startup_timeout_s = 30",
    ]
    return (
        "\n".join(failing)
        + "\n\n"
        + backend_toml("images", models=("sd-tiny",))
        + APPS
        + "[scheduler]\ndefault_load_s = 30\n"
    )


def _try(
    url: str, key: str, call: Callable[[openai.OpenAI], object]
) -> tuple[openai.APIError, list[str]]:
    """Make ``call`` with the client at its default retries; the error it
    raised and the HTTP requests it sent."""
    tries: list[str] = []

    def count(request: Any) -> None:
        tries.append(f"{request.method} {request.url.path}")

    with (
        openai.DefaultHttpxClient(event_hooks={"request": [count]}) as http,
        openai.OpenAI(base_url=url + "/v1", api_key=key, http_client=http, timeout=30) as client,
    ):
        try:
            call(client)
        except openai.APIError as exc:
            return exc, tries
    raise AssertionError("the call succeeded")


def _chat(client: openai.OpenAI) -> object:
    return client.chat.completions.create(
        model="broken-llm", messages=[{"role": "user", "content": "hi"}]
    )


def _image(client: openai.OpenAI) -> object:
    return client.images.generate(
        model="sd-tiny", prompt="a cat", extra_headers={"X-Yard-Start-Within": "0.5"}
    )


def _models(client: openai.OpenAI) -> object:
    return client.models.list()


async def test_refusals_reach_the_official_client_after_one_try(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with running_yard(tmp_path, _config(tmp_path)) as runtime:
            url = runtime.urls[0]
            failed, chat_tries = await trio.to_thread.run_sync(_try, url, KEY, _chat)
            infeasible, image_tries = await trio.to_thread.run_sync(_try, url, KEY, _image)
            unknown, wrong_tries = await trio.to_thread.run_sync(_try, url, "sk-nobody", _models)
            async with httpx.AsyncClient(base_url=url) as raw:
                no_bearer = await raw.get("/v1/models", headers={"authorization": KEY})
    assert isinstance(failed, openai.InternalServerError), failed
    assert failed.status_code == 502 and failed.code == "backend_failed"
    assert failed.response.headers["x-should-retry"] == "false"
    assert chat_tries == ["POST /v1/chat/completions"]
    assert (tmp_path / "starts.txt").read_text().split() == ["started"]  # one start
    assert isinstance(infeasible, openai.ConflictError), infeasible
    assert infeasible.code == "deadline_infeasible"
    assert image_tries == ["POST /v1/images/generations"]
    assert isinstance(unknown, openai.AuthenticationError), unknown
    assert wrong_tries == ["GET /v1/models"]
    assert no_bearer.status_code == 401
    assert "Bearer" in no_bearer.json()["error"]["message"]


def _job_recipe(url: str) -> tuple[int, str, str]:
    """The recipe of docs/clients.md: hand a chat request in as a job, then
    fetch its answer as a ChatCompletion."""
    from openai.types.chat import ChatCompletion

    with openai.OpenAI(base_url=url + "/v1", api_key=KEY) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="chat-tiny",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"Prefer": "respond-async"},
        )
        job = raw.http_response.json()
        completion = client.get(
            f"/jobs/{job['id']}/result",
            cast_to=ChatCompletion,
            options={"params": {"wait": 60}},
        )
    return raw.status_code, job["object"], completion.object


async def test_the_documented_job_recipe_works_with_the_official_client(tmp_path: Path) -> None:
    body = backend_toml("llm", models=("chat-tiny",)) + APPS
    with trio.fail_after(120):
        async with running_yard(tmp_path, body) as runtime:
            status, job, answer = await trio.to_thread.run_sync(_job_recipe, runtime.urls[0])
    assert (status, job, answer) == (202, "job", "chat.completion")

"""The official ``openai`` client against a real ``yard serve`` process
(loopback): files.create(purpose="batch"), batches.create, retrieve until it
ends, files.content; once with the test backend, once with the real
llama-server of config/demo.toml (a tiny model of random weights)."""

from __future__ import annotations

import json
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from openai import OpenAI

from tests.batches.helpers import chat_line, jsonl
from tests.gateway.conftest import backend_toml
from tests.real.servers import free_port, llama_server_or_skip, running_server, yard_argv
from tests.real.test_through_yard import _demo_copy

pytestmark = pytest.mark.slow

KEY = "sk-batch-app"
APP = f"""
[apps.batcher]
key = "{KEY}"
default_priority = 50
max_priority = 80
"""
ENDED = ("completed", "failed", "expired", "cancelled")


def _run_batch(
    base_url: str, key: str, lines: list[dict[str, Any]], *, within_s: float
) -> dict[str, Any]:
    """Hand ``lines`` in as a batch with the openai client, wait (at most
    ``within_s``) until it ends; return what the client saw."""
    with OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=30) as client:
        uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"test": "openai-client"},
        )
        created = batch.status
        deadline = time.monotonic() + within_s
        while batch.status not in ENDED:
            assert time.monotonic() < deadline, f"batch still {batch.status}"
            time.sleep(0.1)
            batch = client.batches.retrieve(batch.id)
        output = []
        if batch.output_file_id is not None:
            text = client.files.content(batch.output_file_id).text
            output = [json.loads(line) for line in text.splitlines()]
        listed = [b.id for b in client.batches.list(limit=10)]
        files = {f.id for f in client.files.list()}
        return {
            "created": created,
            "batch": batch,
            "output": output,
            "listed": listed,
            "files": files,
            "input_file_id": uploaded.id,
        }


def _check(seen: dict[str, Any], n: int) -> None:
    batch = seen["batch"]
    assert seen["created"] == "validating"
    assert batch.status == "completed", batch
    assert batch.request_counts.total == n
    assert batch.request_counts.completed == n
    assert batch.request_counts.failed == 0
    assert batch.metadata == {"test": "openai-client"}
    assert batch.id in seen["listed"]
    assert {seen["input_file_id"], batch.output_file_id} <= seen["files"]
    assert sorted(line["custom_id"] for line in seen["output"]) == sorted(
        f"line-{i}" for i in range(n)
    )
    for line in seen["output"]:
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["object"] == "chat.completion"


async def test_the_openai_client_runs_a_batch_through_yard_serve(tmp_path: Path) -> None:
    config = tmp_path / "yard.toml"
    config.write_text(
        f'[server]\ndata_dir = "{tmp_path / "data"}"\nstop_grace_s = 2\n\n'
        + backend_toml("llm", models=("tiny",), slots=2)
        + APP
    )
    port = free_port()
    lines = [chat_line(f"line-{i}", content=f"question {i}") for i in range(8)]
    with trio.fail_after(120):
        async with running_server(
            yard_argv(config, port), port=port, log=tmp_path / "yard.log", health_path="/healthz"
        ) as yard:
            seen = await trio.to_thread.run_sync(
                partial(_run_batch, yard.base_url, KEY, lines, within_s=60)
            )
    _check(seen, 8)


async def test_a_small_real_batch_on_llama_server_finishes_every_line_inside_its_window(
    tmp_path: Path,
) -> None:
    llama_server_or_skip()
    config = _demo_copy(tmp_path)
    port = free_port()
    lines = []
    for i in range(6):
        line = chat_line(f"line-{i}", model="tiny-llama", content=f"tell me {i}")
        line["body"].update(max_tokens=8, ignore_eos=True)
        lines.append(line)
    with trio.fail_after(240):
        async with running_server(
            yard_argv(config, port), port=port, log=tmp_path / "yard.log", health_path="/healthz"
        ) as yard:
            seen = await trio.to_thread.run_sync(
                partial(_run_batch, yard.base_url, "sk-notebook", lines, within_s=180)
            )
            async with httpx.AsyncClient(
                base_url=yard.base_url, headers={"authorization": "Bearer sk-notebook"}
            ) as client:
                jobs = [
                    (await client.get(f"/v1/jobs/{line['response']['request_id']}")).json()
                    for line in seen["output"]
                ]
    _check(seen, 6)
    expires_at = seen["batch"].expires_at
    for job in jobs:
        finished = job["finished_at"]
        assert job["status"] in ("succeeded", "expired"), job
        assert finished is not None
        assert datetime.fromisoformat(finished).timestamp() <= expires_at

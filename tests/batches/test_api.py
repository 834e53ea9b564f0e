"""The Batch API end to end in one process: ``yard serve``'s nursery, a real
test backend, real sockets (loopback)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.batches.helpers import chat_line, create, jsonl, lines_of, until_ended, upload
from tests.gateway.conftest import backend_toml, running_yard, wait_until

pytestmark = pytest.mark.slow

APPS = """
[apps.alice]
key = "sk-alice"
default_priority = 50
max_priority = 80

[apps.bob]
key = "sk-bob"
default_priority = 50
max_priority = 80
"""


def _body(tmp_path: Path, **switches: object) -> str:
    served = tmp_path / "served.txt"
    return (
        backend_toml("llm", models=("tiny",), switches={"counter_file": served, **switches}) + APPS
    )


def _client(url: str, key: str = "sk-alice") -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=10.0)


async def test_a_batch_runs_every_line_as_a_job_and_writes_openais_output_format(
    tmp_path: Path,
) -> None:
    lines = [chat_line(f"req-{i}", content=f"hello {i}") for i in range(5)]
    with trio.fail_after(60):
        async with (
            running_yard(tmp_path, _body(tmp_path)) as runtime,
            _client(runtime.urls[0]) as client,
        ):
            file_id = await upload(client, jsonl(lines))
            meta = {"purpose": "test"}
            batch = await create(client, file_id, metadata=meta)
            assert batch["status"] == "validating"
            assert batch["object"] == "batch"
            assert batch["metadata"] == meta
            assert batch["expires_at"] - batch["created_at"] == 24 * 3600
            done = await until_ended(client, batch["id"])
            output = await lines_of(client, done["output_file_id"])
            jobs = (await client.get("/v1/jobs", params={"limit": "100"})).json()["data"]
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert done["error_file_id"] is None
    for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
        assert isinstance(done[stamp], int)
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(5)]
    for line in output:
        assert set(line) == {"id", "custom_id", "response", "error"}
        assert line["id"].startswith("batch_req_")
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["object"] == "chat.completion"
    # Each line was one job of alice's, in the same store, run once.
    assert sorted(j["id"] for j in jobs) == sorted(
        line["response"]["request_id"] for line in output
    )
    # On schedule: [jobs] batch_priority_drop (10) below alice's default (50).
    assert {j["priority"] for j in jobs} == {40.0}
    served = (tmp_path / "served.txt").read_text().split()
    assert sorted(served) == sorted(j["id"] for j in jobs)


async def test_bad_lines_fail_the_batch_with_openais_errors(tmp_path: Path) -> None:
    bad = jsonl([chat_line("a"), chat_line("a"), chat_line("b", model="huge")]) + b"{oops\n"
    with trio.fail_after(60):
        async with (
            running_yard(tmp_path, _body(tmp_path)) as runtime,
            _client(runtime.urls[0]) as client,
        ):
            batch = await create(client, await upload(client, bad))
            done = await until_ended(client, batch["id"])
    assert done["status"] == "failed"
    assert isinstance(done["failed_at"], int)
    assert done["errors"]["object"] == "list"
    assert [(e["code"], e["line"]) for e in done["errors"]["data"]] == [
        ("duplicate_custom_id", 2),
        ("model_not_found", 3),
        ("invalid_json_line", 4),
    ]
    assert not (tmp_path / "served.txt").exists()


async def test_files_and_batches_belong_to_their_app(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_yard(tmp_path, _body(tmp_path)) as runtime:
            url = runtime.urls[0]
            async with _client(url) as alice, _client(url, "sk-bob") as bob:
                file_id = await upload(alice, jsonl([chat_line("a")]))
                batch = await create(alice, file_id)
                for path in (
                    f"/v1/files/{file_id}",
                    f"/v1/files/{file_id}/content",
                    f"/v1/batches/{batch['id']}",
                ):
                    response = await bob.get(path)
                    assert response.status_code == 404, path
                    assert response.json()["error"]["code"] in ("file_not_found", "batch_not_found")
                assert (await bob.get("/v1/files")).json()["data"] == []
                assert (await bob.get("/v1/batches")).json()["data"] == []
                stolen = await bob.post(
                    "/v1/batches",
                    json={
                        "input_file_id": file_id,
                        "endpoint": "/v1/chat/completions",
                        "completion_window": "24h",
                    },
                )
                assert stolen.status_code == 404
                listed = (await alice.get("/v1/files")).json()
                assert [f["id"] for f in listed["data"]] == [file_id]
                assert listed["data"][0]["purpose"] == "batch"
                await until_ended(alice, batch["id"])
                deleted = (await alice.delete(f"/v1/files/{file_id}")).json()
                assert deleted == {"id": file_id, "object": "file", "deleted": True}
                assert (await alice.get(f"/v1/files/{file_id}")).status_code == 404


async def test_bad_requests_get_openais_error_shape_with_the_param(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with (
            running_yard(tmp_path, _body(tmp_path)) as runtime,
            _client(runtime.urls[0]) as client,
        ):
            file_id = await upload(client, jsonl([chat_line("a")]))
            cases: list[tuple[dict[str, object], str]] = [
                ({"endpoint": "/v1/nope", "completion_window": "24h"}, "endpoint"),
                (
                    {"endpoint": "/v1/chat/completions", "completion_window": "2d"},
                    "completion_window",
                ),
                (
                    {"endpoint": "/v1/chat/completions", "completion_window": "169h"},
                    "completion_window",
                ),
                (
                    {"endpoint": "/v1/chat/completions", "completion_window": "0h"},
                    "completion_window",
                ),
                (
                    {
                        "endpoint": "/v1/chat/completions",
                        "completion_window": "1h",
                        "metadata": {"k": 1},
                    },
                    "metadata",
                ),
            ]
            for extra, param in cases:
                response = await client.post(
                    "/v1/batches", json={"input_file_id": file_id, **extra}
                )
                assert response.status_code == 400, (extra, response.text)
                error = response.json()["error"]
                assert error["param"] == param
                assert error["type"] == "invalid_request_error"
                # The official clients must not try a refusal again (issue 24, 1).
                assert response.headers["x-should-retry"] == "false"
            missing = await client.post(
                "/v1/batches",
                json={
                    "input_file_id": "file-nope",
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "1h",
                },
            )
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "file_not_found"
            assert missing.headers["x-should-retry"] == "false"
            wrong = await client.post(
                "/v1/files",
                files={"file": ("x.jsonl", b"{}", "application/jsonl")},
                data={"purpose": "fine-tune"},
            )
            assert wrong.status_code == 400
            assert wrong.json()["error"]["param"] == "purpose"
            # Found by the OpenAPI fuzz test: both were 500s.
            for raw in (
                b"\xfc{}",
                b'{"input_file_id": "%s", "endpoint": "/v1/completions", '
                b'"completion_window": "1h", "metadata": {"\\ud800": "x"}}' % file_id.encode(),
            ):
                response = await client.post(
                    "/v1/batches", content=raw, headers={"content-type": "application/json"}
                )
                assert response.status_code == 400, response.text
            async with httpx.AsyncClient(base_url=runtime.urls[0]) as nobody:
                assert (await nobody.get("/v1/batches")).status_code == 401


async def test_cancel_ends_queued_lines_and_keeps_the_finished_ones(tmp_path: Path) -> None:
    lines = [chat_line(f"req-{i}") for i in range(6)]
    with trio.fail_after(60):
        async with (
            running_yard(tmp_path, _body(tmp_path, service_time=0.5)) as runtime,
            _client(runtime.urls[0]) as client,
        ):
            batch = await create(client, await upload(client, jsonl(lines)))
            served = tmp_path / "served.txt"
            await wait_until(lambda: served.exists() and bool(served.read_text().split()))
            cancelled = (await client.post(f"/v1/batches/{batch['id']}/cancel")).json()
            assert cancelled["status"] in ("cancelling", "cancelled")
            assert isinstance(cancelled["cancelling_at"], int)
            done = await until_ended(client, batch["id"])
            again = await client.post(f"/v1/batches/{batch['id']}/cancel")
            output = await lines_of(client, done["output_file_id"])
            errors = await lines_of(client, done["error_file_id"])
    assert done["status"] == "cancelled"
    assert again.status_code == 409
    counts = done["request_counts"]
    assert counts["total"] == 6
    assert counts["completed"] == len(output) >= 1
    assert counts["failed"] == len(errors) >= 1
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert all(e["response"] is None for e in errors)
    ran = served.read_text().split()
    assert len(ran) == len(output)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(
        f"req-{i}" for i in range(6)
    )


async def test_an_embeddings_batch_and_the_admin_who_reads_every_apps_batches(
    tmp_path: Path,
) -> None:
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "tiny", "input": f"text {i}"},
        }
        for i in range(3)
    ]
    # Still inside the [server] table that running_yard writes first.
    body = 'admin_key = "sk-admin"\n\n' + _body(tmp_path)
    with trio.fail_after(60):
        async with (
            running_yard(tmp_path, body) as runtime,
            _client(runtime.urls[0]) as client,
            _client(runtime.urls[0], "sk-admin") as admin,
        ):
            file_id = await upload(client, jsonl(lines))
            response = await client.post(
                "/v1/batches",
                json={
                    "input_file_id": file_id,
                    "endpoint": "/v1/embeddings",
                    "completion_window": "2h",
                },
            )
            assert response.status_code == 200, response.text
            done = await until_ended(client, response.json()["id"])
            output = await lines_of(client, done["output_file_id"])
            listed = (await admin.get("/v1/batches")).json()["data"]
            refused = await admin.post(
                "/v1/files", files={"file": ("x", b"{}")}, data={"purpose": "batch"}
            )
    assert done["status"] == "completed"
    assert done["expires_at"] - done["created_at"] == 2 * 3600
    assert [line["response"]["body"]["object"] for line in output] == ["list"] * 3
    assert [b["id"] for b in listed] == [done["id"]]
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "admin_cannot_submit"

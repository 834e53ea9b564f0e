"""The Batch API on two real ``yard serve`` nodes sharing one PostgreSQL: a
batch created on node a has its lines served by node b (which has the model
loaded) and its output read on a; a batch is cancelled from the other node;
a batch whose driving node is SIGKILLed is finished by the other one."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.batches.helpers import chat_line, create, jsonl, lines_of, until_ended, upload
from yard.testing.cluster import backend_table, running_cluster


def _tables(tmp_path: Path, service_time: float) -> dict[str, str]:
    """Nodes a and b, each with the model ``tiny``; each backend writes the
    requests it served to its own file."""
    return {
        name: backend_table(
            "llm",
            ["tiny"],
            service_time=service_time,
            counter_file=str(tmp_path / f"served-{name}.txt"),
        )
        for name in ("a", "b")
    }


def _served(tmp_path: Path, name: str) -> list[str]:
    path = tmp_path / f"served-{name}.txt"
    return path.read_text().split() if path.exists() else []


async def _in_progress(client: httpx.AsyncClient, batch_id: str) -> None:
    """Until the batch's lines are written; the caller bounds the wait."""
    while True:
        if (await client.get(f"/v1/batches/{batch_id}")).json()["status"] == "in_progress":
            return
        await trio.sleep(0.05)


@pytest.mark.slow
async def test_a_batch_created_on_one_node_is_served_by_another_and_read_anywhere(
    postgres_dsn: str, tmp_path: Path
) -> None:
    async with running_cluster(postgres_dsn, tmp_path, _tables(tmp_path, 0.05)) as cluster:
        a, b = cluster.clients["a"], cluster.clients["b"]
        with trio.fail_after(60):
            # b has the model loaded: a leaves the shared queue's jobs to it.
            await cluster.load("b", "llm")
            file_id = await upload(
                a, jsonl([chat_line(f"c{i}", content=f"n{i}") for i in range(6)])
            )
            # The upload is in the shared database: b reads it too.
            assert (await b.get(f"/v1/files/{file_id}")).json()["filename"] == "in.jsonl"
            batch = await create(a, file_id)
            ended = await until_ended(b, batch["id"])
            assert ended["status"] == "completed", ended
            assert ended["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
            output = await lines_of(a, ended["output_file_id"])
        assert sorted(line["custom_id"] for line in output) == [f"c{i}" for i in range(6)]
        assert all(line["response"]["status_code"] == 200 for line in output)
        # Each line ran once, on b.
        served_b = [i for i in _served(tmp_path, "b") if i.startswith("job_")]
        assert len(served_b) == 6 and len(set(served_b)) == 6
        assert not [i for i in _served(tmp_path, "a") if i.startswith("job_")]
        listed = (await b.get("/v1/batches")).json()["data"]
        assert [x["id"] for x in listed] == [batch["id"]]


@pytest.mark.slow
async def test_a_batch_is_cancelled_from_the_other_node(postgres_dsn: str, tmp_path: Path) -> None:
    async with running_cluster(postgres_dsn, tmp_path, _tables(tmp_path, 1.0)) as cluster:
        a, b = cluster.clients["a"], cluster.clients["b"]
        with trio.fail_after(60):
            await cluster.load("b", "llm")
            file_id = await upload(a, jsonl([chat_line(f"c{i}") for i in range(8)]))
            batch = await create(a, file_id)
            await _in_progress(b, batch["id"])
            response = await b.post(f"/v1/batches/{batch['id']}/cancel")
            assert response.status_code == 200, response.text
            assert response.json()["status"] in ("cancelling", "cancelled")
            # The running line finishes (1 s); the rest never start.
            ended = await until_ended(a, batch["id"])
        assert ended["status"] == "cancelled", ended
        counts = ended["request_counts"]
        assert counts["total"] == 8 and counts["completed"] + counts["failed"] == 8
        assert counts["completed"] <= 3, counts
        errors = await lines_of(b, ended["error_file_id"])
        codes = {line["error"]["code"] for line in errors if line.get("error")}
        assert codes <= {"batch_cancelled"} and len(errors) == 8 - counts["completed"]
        served = [i for n in ("a", "b") for i in _served(tmp_path, n) if i.startswith("job_")]
        assert len(served) == counts["completed"]


@pytest.mark.slow
async def test_a_batch_whose_driving_node_is_killed_is_finished_by_the_other(
    postgres_dsn: str, tmp_path: Path
) -> None:
    async with running_cluster(postgres_dsn, tmp_path, _tables(tmp_path, 0.3)) as cluster:
        a, b = cluster.clients["a"], cluster.clients["b"]
        with trio.fail_after(60):
            await cluster.load("b", "llm")
            file_id = await upload(a, jsonl([chat_line(f"c{i}") for i in range(8)]))
            batch = await create(a, file_id)
            await _in_progress(b, batch["id"])
            # a drives the batch; it dies. b declares it gone and takes over.
            cluster.kill("a")
            ended = await until_ended(b, batch["id"])
            output = await lines_of(b, ended["output_file_id"])
        assert ended["status"] == "completed", ended
        assert ended["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
        assert sorted(line["custom_id"] for line in output) == sorted(f"c{i}" for i in range(8))
        # b served every line, each once (a had none loaded).
        served_b = [i for i in _served(tmp_path, "b") if i.startswith("job_")]
        assert sorted(served_b) == sorted(set(served_b)) and len(served_b) == 8

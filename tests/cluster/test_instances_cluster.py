"""A backend with several instances in a cluster: two real ``yard serve`` nodes on
one real PostgreSQL, real test backends. Shared jobs for the model run on every
instance a node has, each exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from yard.cluster.policy import LocalBackend, by_first_instance, hungry
from yard.testing.cluster import CHAT, backend_table, running_cluster, submit, wait_ended

SERVICE_S = 5.0
"""Long against the test backend's load (about a second), so that a job waiting
behind another on the first instance is better served by loading the second
(docs/instances.md; the test's backend sets instance_load_penalty = 0, so the
load need only be shorter than the wait, even on a loaded machine)."""


# -- the claim's view of a backend's instances (pure) ------------------------------------


def test_a_busy_first_instance_with_a_second_that_can_start_claims_one_more_job() -> None:
    views = [
        LocalBackend(name="llm", state="ready", running=1),
        LocalBackend(name="llm@2", fits="free"),
        LocalBackend(name="chat", state="ready"),
    ]
    folded = by_first_instance(views)
    assert folded == [
        LocalBackend(name="llm", slots=2, state="ready", running=1),
        LocalBackend(name="chat", state="ready"),
        LocalBackend(name="llm@2", fits="free"),  # for jobs sent to it by name
    ]
    # Jobs for the model name the first instance: its group claims them.
    assert hungry(folded).claim == ("chat", "llm", "llm@2")
    # Before the fold, a busy llm claimed nothing, and llm@2 only its own jobs.
    assert hungry(views).claim == ("chat", "llm@2")


def test_instances_together_claim_their_free_slots_and_no_more() -> None:
    both_busy = [
        LocalBackend(name="llm", slots=2, state="ready", running=2),
        LocalBackend(name="llm@2", slots=2, state="loading", waiting=2),
    ]
    assert by_first_instance(both_busy) == [
        LocalBackend(name="llm", slots=4, state="ready", running=2, waiting=2),
        both_busy[1],
    ]
    assert not hungry(by_first_instance(both_busy))
    # A job already waits for the second's load: no further one for it.
    waiting_for_second = [
        LocalBackend(name="llm", state="ready", running=1),
        LocalBackend(name="llm@2", waiting=1, fits="free"),
    ]
    assert not hungry(by_first_instance(waiting_for_second))


def test_stopped_instances_claim_as_their_first_and_are_left_to_a_node_with_one_loaded() -> None:
    stopped = [LocalBackend(name="llm", fits="evict"), LocalBackend(name="llm@2", fits="free")]
    assert by_first_instance(stopped) == [LocalBackend(name="llm", fits="evict"), stopped[1]]
    assert hungry(by_first_instance(stopped)).claim == ("llm", "llm@2")
    elsewhere = hungry(by_first_instance(stopped), loaded_elsewhere=frozenset({"llm"}))
    assert elsewhere.claim == ("llm@2",)  # only jobs sent to llm@2 by its name


def test_a_job_sent_to_a_further_instance_by_name_is_claimed_for_it() -> None:
    views = [
        LocalBackend(name="llm", state="ready", running=1),
        LocalBackend(name="llm@2", state="ready", running=1),
        LocalBackend(name="llm@3", state="ready"),
    ]
    assert hungry(by_first_instance(views)).claim == ("llm", "llm@3")


# -- real nodes ---------------------------------------------------------------------------


async def _served(client: httpx.AsyncClient) -> dict[str, int]:
    status: dict[str, Any] = (await client.get("/admin/status")).json()
    return {b["name"]: int(b["served"]) for b in status["backends"]}


async def _wait_all_stopped(client: httpx.AsyncClient) -> None:
    """Until every backend of the node is stopped; the caller bounds the wait."""
    while True:
        status: dict[str, Any] = (await client.get("/admin/status")).json()
        if {b["state"] for b in status["backends"]} == {"stopped"}:
            return
        await trio.sleep(0.1)


@pytest.mark.slow
async def test_shared_jobs_run_on_both_instances_and_none_is_lost(
    postgres_dsn: str, tmp_path: Path
) -> None:
    served_file = tmp_path / "served.txt"
    llm = (
        backend_table("llm", ["tiny"], service_time=SERVICE_S, counter_file=str(served_file))
        + "instances = 2\ninstance_load_penalty = 0\n"
    )
    async with running_cluster(postgres_dsn, tmp_path, {"a": llm, "b": llm}) as cluster:
        a, b = cluster.clients["a"], cluster.clients["b"]
        with trio.fail_after(120):
            # a loads (and measures) the first instance; b leaves the model's
            # jobs to a, whose second instance can take them.
            await cluster.load("a", "llm")
            ids = [await submit((a, b)[i % 2], 50) for i in range(4)]
            jobs = await wait_ended(a, ids)
            served_a, served_b = await _served(a), await _served(b)
            # Two synchronous requests sent to b at once go to a, where the
            # model is ready, and take one instance each.
            answers: list[httpx.Response] = []

            async def ask() -> None:
                answers.append(await b.post("/v1/chat/completions", json=CHAT))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                nursery.start_soon(ask)
            served_sync = await _served(a)
            # The operator unloads the model's backend by its name: both go.
            unload = await a.post("/admin/backends/llm/unload")
            await _wait_all_stopped(a)
            load = await a.post("/admin/backends/llm/load")
        assert [job["status"] for job in jobs] == ["succeeded"] * len(ids)
        # Nothing lost, nothing run twice.
        lines = [line for line in served_file.read_text().split() if line in ids]
        assert sorted(lines) == sorted(ids)
        assert served_b.get("llm", 0) + served_b.get("llm@2", 0) == 0
        # Both of a's instances served: the jobs did not queue behind one.
        assert served_a["llm"] >= 1 and served_a["llm@2"] >= 1, served_a
        assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
        assert [r.headers["x-yard-node"] for r in answers] == ["a", "a"]
        assert served_sync == {"llm": served_a["llm"] + 1, "llm@2": served_a["llm@2"] + 1}
        assert unload.status_code == 202, unload.text
        assert [i["backend"] for i in unload.json()["instances"]] == ["llm", "llm@2"]
        assert load.status_code == 202, load.text
        assert [i["backend"] for i in load.json()["instances"]] == ["llm"]

"""Fault injection: a real ``yard serve`` killed with SIGKILL at random moments
(seeded) while jobs are handed in and run against a real test backend.

After every restart: every accepted job (one that got its 202) is still
there; none ran twice (a job handed in as rerun-safe may run once more, after
a restart interrupted it); the backend served jobs in the order they were
handed in (one slot, one priority, so the queue is first-come first-served and
a restored job keeps its old place). At the end, with yard left running,
every job ends: succeeded, or failed as ``interrupted``.

Replay a failure with the seed it prints: ``YARD_KILL_SEED=N``; more or fewer
kills with ``YARD_KILLS=N``.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.gateway.conftest import backend_toml
from yard.testing.client import client as plain_body_client

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
SEED = int(os.environ.get("YARD_KILL_SEED", "20261202"))
KILLS = int(os.environ.get("YARD_KILLS", "50"))
EARLY_KILL_SHARE = 0.25  # killed during start-up / restore, before any check
# Bounds on conditions, generous for a loaded 2-core machine (each is met in
# about a second, or a few for the final drain, when the machine is idle).
HEALTHY_WITHIN_S = 60.0  # a restarted yard answers /healthz (restore included)
DRAINED_WITHIN_S = 120.0  # with yard left running, every job has ended
STOPPED_WITHIN_S = 30.0  # SIGTERM: backends stopped (stop_grace_s = 1), yard gone
WHOLE_TEST_S = 900.0  # a backstop: the bounds above fail first


@dataclass
class Record:
    """What the client knows: the jobs it got a 202 for, in order."""

    accepted: list[str] = field(default_factory=list)
    rerun_safe: set[str] = field(default_factory=set)
    sent: int = 0
    checks: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill_backends(data_dir: Path) -> None:
    """Best-effort cleanup of backend groups a killed yard left behind."""
    for pid_file in (data_dir / "run").glob("*.pid"):
        try:
            pgid = int(json.loads(pid_file.read_text())["pgid"])
            os.killpg(pgid, signal.SIGKILL)
        except (OSError, ValueError, KeyError, TypeError):
            continue


def _open_log(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)


async def _start(argv: list[str], log_path: Path) -> trio.Process:
    """Start ``yard serve`` in its own session, its output in ``log_path``."""
    log = _open_log(log_path)
    try:
        return await trio.lowlevel.open_process(
            argv, stdout=log, stderr=log, start_new_session=True
        )
    finally:
        os.close(log)


async def _all_jobs(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Every job yard knows, oldest first."""
    jobs: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        params = {"limit": "100", **({"after": after} if after else {})}
        page = (await client.get("/v1/jobs", params=params)).json()
        jobs.extend(page["data"])
        if not page["has_more"]:
            return jobs[::-1]
        after = page["last_id"]


async def _wait_healthy(client: httpx.AsyncClient) -> None:
    """Return once yard answers ``/healthz``; the caller bounds the wait."""
    while True:
        try:
            if (await client.get("/healthz", timeout=5.0)).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await trio.sleep(0.05)


async def _submit_forever(client: httpx.AsyncClient, record: Record, rng: random.Random) -> None:
    while True:
        rerun_safe = rng.random() < 0.2
        prefer = "respond-async, rerun-safe" if rerun_safe else "respond-async"
        record.sent += 1
        try:
            response = await client.post(
                "/v1/chat/completions", json=CHAT, headers={"prefer": prefer}, timeout=5.0
            )
        except httpx.TransportError:
            # yard died with the request in flight: not accepted (though it
            # may be on disk, and run: yard had not answered yet).
            await trio.sleep(0.05)
            continue
        assert response.status_code == 202, response.text
        job_id = str(response.json()["id"])
        record.accepted.append(job_id)
        if rerun_safe:
            record.rerun_safe.add(job_id)
        await trio.sleep(rng.uniform(0.0, 0.04))


def _check(record: Record, jobs: list[dict[str, Any]], served: list[str], seed: int) -> None:
    """The three promises, against what yard lists and what the backend ran."""
    where = f"(seed {seed}, check {record.checks})"
    known = {job["id"]: job for job in jobs}
    lost = [job_id for job_id in record.accepted if job_id not in known]
    assert not lost, f"accepted jobs lost {where}: {lost}"
    strangers = {job_id for job_id in served if job_id not in known}
    assert not strangers, f"the backend ran jobs yard does not know {where}: {strangers}"
    runs = collections.Counter(served)
    for job_id, n in runs.items():
        allowed = 2 if known[job_id]["rerun_safe"] else 1
        assert n <= allowed, f"{job_id} ran {n} times {where}"
    place = {job["id"]: i for i, job in enumerate(jobs)}
    order = [place[job_id] for job_id in served]
    out_of_order = [(a, b) for a, b in itertools.pairwise(order) if b < a]
    assert not out_of_order, f"served out of arrival order {where}: {out_of_order[:5]}"
    record.checks += 1


@pytest.mark.slow
async def test_no_accepted_job_is_lost_or_run_twice_across_fifty_sigkills(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    data_dir = tmp_path / "data"
    served_file = tmp_path / "served.txt"
    port = _free_port()
    config = tmp_path / "yard.toml"
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "{data_dir}"\nstop_grace_s = 1\n\n'
        # Fifty lives hand in about a thousand jobs, all kept: above the default quota.
        + "[jobs]\nmax_jobs_per_app = 100000\n\n"
        + backend_toml(
            "llm",
            models=("tiny",),
            switches={"service_time": 0.02, "counter_file": str(served_file)},
        )
    )
    argv = [sys.executable, "-m", "yard.cli", "serve", "--config", str(config)]
    record = Record()
    started = time.monotonic()
    process: trio.Process | None = None

    def served() -> list[str]:
        return served_file.read_text().split() if served_file.exists() else []

    try:
        with trio.fail_after(WHOLE_TEST_S):
            # No client-side timeout: each wait below is bounded on its condition.
            async with plain_body_client(f"http://127.0.0.1:{port}", timeout=None) as client:
                for kill in range(KILLS):
                    process = await _start(argv, tmp_path / f"yard-{kill}.log")
                    if rng.random() < EARLY_KILL_SHARE:
                        await trio.sleep(rng.uniform(0.0, 1.2))
                    else:
                        with trio.fail_after(HEALTHY_WITHIN_S):
                            await _wait_healthy(client)
                        _check(record, await _all_jobs(client), served(), SEED)
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(_submit_forever, client, record, rng)
                            await trio.sleep(rng.uniform(0.05, 1.5))
                            process.kill()
                            await process.wait()
                            nursery.cancel_scope.cancel()
                    process.kill()
                    await process.wait()

                process = await _start(argv, tmp_path / "yard-final.log")
                with trio.fail_after(HEALTHY_WITHIN_S):
                    await _wait_healthy(client)
                jobs = await _all_jobs(client)
                _check(record, jobs, served(), SEED)
                with trio.fail_after(DRAINED_WITHIN_S):
                    while any(job["status"] in ("queued", "running") for job in jobs):
                        await trio.sleep(0.2)
                        jobs = await _all_jobs(client)
                _check(record, jobs, served(), SEED)
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(STOPPED_WITHIN_S):
                    await process.wait()
    finally:
        if process is not None and process.returncode is None:
            process.kill()
        _kill_backends(data_dir)

    runs = collections.Counter(served())
    statuses = collections.Counter(job["status"] for job in jobs)
    codes = collections.Counter(job["error"]["code"] for job in jobs if job["error"])
    assert set(statuses) <= {"succeeded", "failed"}, statuses
    assert set(codes) <= {"interrupted"}, codes
    for job in jobs:
        if job["status"] == "succeeded":
            assert runs[job["id"]] >= 1, f"{job['id']} succeeded without running (seed {SEED})"
    figures = {
        "seed": SEED,
        "kills": KILLS,
        "checks_after_restart": record.checks,
        "requests_sent": record.sent,
        "accepted": len(record.accepted),
        "jobs_on_disk": len(jobs),
        "accepted_rerun_safe": len(record.rerun_safe),
        "succeeded": statuses["succeeded"],
        "interrupted": codes["interrupted"],
        "ran_twice_rerun_safe": sum(1 for n in runs.values() if n == 2),
        "seconds": round(time.monotonic() - started, 1),
    }
    print("kill test:", json.dumps(figures))
    assert record.checks >= KILLS * (1 - EARLY_KILL_SHARE) / 2
    assert len(record.accepted) > KILLS

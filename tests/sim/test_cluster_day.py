"""The two-host radio day (:mod:`sim.cluster`): two one-GPU hosts, each with its own
engine and core, one shared queue with database latency, claims by
``yard.cluster.policy.hungry`` and synchronous requests routed by ``route``."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from functools import cache

from sim.cluster import (
    MACHINES,
    ClusterRun,
    Job,
    Latency,
    SharedQueue,
    _devices_and_backends,
    cluster_scenario,
    run_cluster,
    table,
)
from sim.metrics import metrics
from sim.runner import RequestRecord
from sim.workload import Arrival, renumber
from tests.core.harness import Harness, gpu, host
from yard.cluster.policy import Hunger
from yard.core import BackendSpec


@cache
def two_hours() -> ClusterRun:
    """Midnight to 02:00 of the radio day's seed: night chat, overnight music, two
    hours of news and voice-overs."""
    return run_cluster(2.0)


def test_two_hour_day_has_no_oom_no_stuck_request_and_meets_every_feasible_deadline() -> None:
    day = two_hours()
    row = metrics(day.result)
    assert row["ooms"] == 0
    assert row["stuck"] == 0
    assert row["deadlines_met"] > 0
    assert row["deadlines_missed_avoidable"] == 0
    assert row["loads"] <= 1.2 * row["loads_lower_bound"]


def test_both_hosts_take_jobs_and_chat_is_forwarded_to_the_host_that_has_it() -> None:
    day = two_hours()
    assert all(count > 0 for count in day.claims.values()), day.claims
    assert {job.origin for job in day.jobs} == {"a", "b"}
    # About half the chat reaches the host without chat loaded, and is forwarded.
    chat = sum(r.arrival.app == "chat" for r in day.result.records)
    assert 0 < day.forwarded < chat
    # One instance of each model across the cluster: no model loaded on both hosts.
    loaded_on: dict[str, set[str]] = {}
    for _, backend, gpus in day.result.launches:
        loaded_on.setdefault(backend, set()).update(gpus)
    assert all(len(gpus) == 1 for gpus in loaded_on.values()), loaded_on


def test_one_priority_order_holds_across_hosts() -> None:
    """Of two jobs for one backend that waited in the shared queue together, the
    better-ranked one was claimed first, whichever host each was handed in at."""
    day = two_hours()
    by_backend: dict[str, list[Job]] = {}
    for job in day.jobs:
        assert job.claimed_at is not None, job
        by_backend.setdefault(job.record.arrival.backend, []).append(job)
    pairs = 0
    for jobs in by_backend.values():
        for x in jobs:
            for y in jobs:
                assert x.claimed_at is not None and y.claimed_at is not None
                together = max(x.inserted_at, y.inserted_at) < min(x.claimed_at, y.claimed_at)
                if together and x.rank > y.rank:
                    pairs += 1
                    assert x.claimed_at <= y.claimed_at, (x, y)
    assert pairs > 0, "no two jobs ever waited together: the test would prove nothing"
    crossed = [
        (x, y)
        for jobs in by_backend.values()
        for x in jobs
        for y in jobs
        if x.origin != y.origin and x.rank > y.rank
    ]
    assert crossed


def _urgent_and_not(rng: random.Random) -> list[Arrival]:
    """One long script that keeps the news model busy, then twelve scripts handed in
    a second apart at either host, low and high priority alternating."""
    first = Arrival(
        at=0.0,
        request_id="",
        backend="news-llm",
        priority=50,
        service_s=300.0,
        cls="normal",
        app="newsroom",
    )
    rest = [
        Arrival(
            at=100.0 + i,
            request_id="",
            backend="news-llm",
            priority=90 if i % 2 else 10,
            service_s=10.0,
            cls="high" if i % 2 else "low",
            app="newsroom",
        )
        for i in range(12)
    ]
    return renumber([first, *rest])


def test_a_high_priority_job_handed_to_one_host_goes_before_a_low_one_handed_to_the_other() -> None:
    base = cluster_scenario(1.0)
    scenario = replace(base, name="urgent-and-not", workload=_urgent_and_not, horizon_s=3600.0)
    day = run_cluster(scenario=scenario, seed=3)
    jobs = sorted(day.jobs, key=lambda j: j.record.dispatches[0])
    order = [j.record.arrival.priority for j in jobs]
    assert order == [50] + [90] * 6 + [10] * 6
    # They came in at both hosts, and were all served where the model was loaded.
    assert {j.origin for j in jobs[1:7]} == {"a", "b"}
    assert {j.origin for j in jobs[7:]} == {"a", "b"}
    assert len({j.claimed_by for j in jobs}) == 1


def test_same_seed_same_day() -> None:
    one = run_cluster(0.5, 7)
    two = run_cluster(0.5, 7)
    assert one.result.log_digest == two.result.log_digest
    assert [r.dispatches for r in one.result.records] == [r.dispatches for r in two.result.records]
    assert run_cluster(0.5, 8).result.log_digest != one.result.log_digest


def _job(seq: int, backend: str, rank: float) -> Job:
    arrival = Arrival(
        at=float(seq), request_id=f"j{seq}", backend=backend, priority=rank, service_s=1.0, cls=""
    )
    return Job(
        record=RequestRecord(arrival, ready_at_arrival=False), rank=rank, seq=seq, origin="a"
    )


def test_shared_queue_claims_the_best_rank_among_the_asked_backends() -> None:
    queue = SharedQueue()
    for job in (_job(0, "image", 40), _job(1, "news", 90), _job(2, "tts", 90), _job(3, "news", 95)):
        queue.insert(job)
    got = queue.claim("b", Hunger(claim=("image", "tts")), now=5.0)
    assert got is not None and (got.record.arrival.request_id, got.claimed_by) == ("j2", "b")
    # Equal ranks: the preferred backend wins; otherwise the earlier job.
    queue.insert(_job(4, "image", 95))
    got = queue.claim("a", Hunger(claim=("image", "news"), prefer=("image",)), now=6.0)
    assert got is not None and got.record.arrival.request_id == "j4"
    got = queue.claim("a", Hunger(claim=("image", "news")), now=7.0)
    assert got is not None and got.record.arrival.request_id == "j3"
    assert queue.claim("a", Hunger(claim=("tts",)), now=8.0) is None
    assert queue.claim("a", Hunger(), now=8.0) is None


def test_latency_draws_stay_within_their_jitter() -> None:
    latency = Latency(claim_s=0.004, jitter=0.5)
    rng = random.Random(1)
    draws = [latency.draw(rng, latency.claim_s) for _ in range(1000)]
    assert min(draws) >= 0.002 and max(draws) <= 0.006
    assert math.isclose(sum(draws) / len(draws), 0.004, rel_tol=0.05)


def test_the_table_judges_each_row_and_reuses_rows_already_measured() -> None:
    one_host = {
        "requests": 10.0, "stuck": 0.0, "ooms": 1.0, "deadlines_met": 3.0,
        "deadlines_missed_avoidable": 1.0, "loads": 5.0, "loads_lower_bound": 4.0,
        "high_wait_p95_s": 12.0, "normal_wait_p95_s": 0.5, "wall_s": 1.0,
    }  # fmt: skip
    known = {(MACHINES[0], 7): one_host, (MACHINES[1], 7): one_host}
    text = table([7], hours=0.5, known=known)
    lines = text.splitlines()
    assert len(lines) == 5
    assert lines[2].startswith(f"| {MACHINES[0]} | 7 | 1 MISSED | 3/4 MISSED | 5/4 = 1.25 MISSED |")
    # The two-host half hour was measured: 0 OOMs, its deadlines and loads judged.
    cells = [cell.strip() for cell in lines[4].split("|")[1:-1]]
    assert cells[:3] == [MACHINES[2], "7", "0 ok"]
    assert cells[3].endswith(" ok") and cells[4].endswith(" ok")


def test_the_light_snapshot_is_the_schedulers_own_devices_and_backends() -> None:
    """sim.cluster builds devices and backends without sorting the queue; they must stay
    what ``Scheduler.snapshot`` says (a guard against the two drifting apart)."""
    backends = [
        BackendSpec(name="news", gpus=("gpu0",)),
        BackendSpec(name="chat", gpus=("gpu0",), slots=4),
    ]
    h = Harness(backends, (gpu(gib=24), host()), profiles={"news": (13.0, 2.0, 40.0)})
    steps: list[Callable[[], object]] = [
        lambda: h.arrive("c1", "chat", at=0.0),
        lambda: h.ready("chat", at=12.0),
        lambda: h.arrive("n1", "news", at=13.0),
        lambda: h.arrive("c2", "chat", at=13.0),
        lambda: h.finish("c1", at=20.0),
    ]
    for step in steps:
        step()
        full = h.s.snapshot(h.now, limit=0)
        light = _devices_and_backends(h.s)
        assert light.devices == full.devices
        assert light.backends == full.backends
        assert light.queue_length == full.queue_length


def test_a_host_holds_a_claimed_job_no_longer_than_its_model_takes_to_load() -> None:
    """No hoarding: a job is claimed when its host can start it, at once on a free
    slot or after the one load it triggered."""
    day = two_hours()
    scenario = cluster_scenario(2.0)
    for job in day.jobs:
        assert job.claimed_at is not None and job.record.dispatches
        model = scenario.model(job.record.arrival.backend)
        held = job.record.dispatches[0] - job.claimed_at
        assert held <= model.load_s * (1 + model.load_jitter) + 1.0, (job, held)

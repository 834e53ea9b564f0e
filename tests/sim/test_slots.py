"""Parallel slots in the simulated world: a process serves up to its slots at once,
each request at the speed its neighbours leave it (``ModelSpec.speedup``), and each
slot beyond the first holds its KV cache on the GPU; yard's core and the baselines
get the same slots."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from sim.runner import SimResult, run
from sim.workload import Arrival, Scenario, renumber
from sim.world import GiB, MachineSpec, ModelSpec, SimProcess, SimWorld

SPEEDUP = (1.0, 1.6)
"""Two at once: each at 0.8 of its speed alone (1.6x together)."""


def _model(**kw: object) -> ModelSpec:
    spec: dict[str, object] = {
        "name": "llm",
        "gpu_bytes": 8 * GiB,
        "load_s": 10.0,
        "load_jitter": 0.0,
        "host_bytes": GiB,
    }
    spec.update(kw)
    return ModelSpec(**spec)  # type: ignore[arg-type]


async def _serve_at(
    world: SimWorld, url: str, at: float, service_s: float, ends: list[float]
) -> None:
    await trio.sleep_until(at)
    assert await world.serve(url, service_s)
    ends.append(trio.current_time())


async def _served(
    model: ModelSpec, starts: list[tuple[float, float]], parallel: int | None
) -> tuple[list[float], SimWorld, SimProcess]:
    """Launch ``model`` at 0 (ready at 10 s) and hand it each (at, service_s)
    directly, as an HTTP client would; the end times, in order, and the world."""
    world = SimWorld(MachineSpec(gpus=(("gpu0", 24 * GiB),)), [model], random.Random(1))
    ends: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        process = await world.launch("llm", ("gpu0",), parallel=parallel)
        await process.wait_ready()
        assert trio.current_time() == 10.0
        async with trio.open_nursery() as clients:
            for at, service_s in starts:
                clients.start_soon(_serve_at, world, process.base_url, at, service_s, ends)
        nursery.cancel_scope.cancel()
    return sorted(ends), world, process


async def test_a_two_slot_process_serves_two_at_once_each_slower(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = _model(parallel=(1, 2), slot_bytes=GiB, speedup=SPEEDUP)
    ends, world, process = await _served(model, [(10.0, 10.0), (10.0, 10.0)], parallel=2)
    # Both at 0.8 of their speed: 10 s of work each takes 12.5 s.
    assert ends == [22.5, 22.5]
    assert (process.slots, process.most_active, world.queued_in_process) == (2, 2, 0)


async def test_a_one_slot_process_serves_one_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = _model(parallel=(1, 2), slot_bytes=GiB, speedup=SPEEDUP)
    ends, world, process = await _served(model, [(10.0, 10.0), (10.0, 10.0)], parallel=1)
    # The second waits inside the server for the one slot, as llama-server queues it.
    assert ends == [20.0, 30.0]
    assert (process.slots, process.most_active, world.queued_in_process) == (1, 1, 1)


async def test_the_speed_is_recomputed_when_a_second_request_joins_and_leaves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = _model(parallel=(1, 2), slot_bytes=GiB, speedup=SPEEDUP)
    ends, _, _ = await _served(model, [(10.0, 10.0), (15.0, 10.0)], parallel=2)
    # A alone from 10 to 15 (5 s of work), then both at 0.8: A's last 5 s take
    # 6.25 s (ends 21.25), by when B has done 5 s; B's last 5 s alone: 26.25.
    assert ends == [21.25, 26.25]


async def test_independent_slots_keep_their_full_speed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # speedup None (every scenario without a slot range): chat's slots as before.
    ends, _, process = await _served(_model(slots=2), [(10.0, 10.0), (10.0, 10.0)], None)
    assert ends == [20.0, 20.0] and process.slots == 2


async def test_each_slot_beyond_the_first_holds_its_cache_on_the_gpu(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = _model(parallel=(1, 3), slot_bytes=GiB)
    for parallel, expected in ((1, 8 * GiB), (3, 10 * GiB), (None, 10 * GiB)):
        world = SimWorld(MachineSpec(gpus=(("gpu0", 24 * GiB),)), [model], random.Random(1))
        async with trio.open_nursery() as nursery:
            await nursery.start(world.run)
            process = await world.launch("llm", ("gpu0",), parallel=parallel)
            await process.wait_ready()
            assert process.usage["gpu0"] == expected, parallel
            nursery.cancel_scope.cancel()
    assert model.fixed().slots == 3 and model.fixed().declared_bytes == 10 * GiB


def _scenario(model: ModelSpec, gpu_bytes: int = 24 * GiB) -> Scenario:
    def workload(rng: random.Random) -> list[Arrival]:
        return renumber(
            [
                Arrival(at=0.0, request_id="", backend="llm", priority=50, service_s=10.0, cls="a")
                for _ in range(3)
            ]
        )

    return Scenario(
        name="slots",
        title="three requests for one model",
        machine=MachineSpec(gpus=(("gpu0", gpu_bytes),)),
        models=(model,),
        workload=workload,
        horizon_s=600.0,
        stored_profiles=True,
        meter_interval_s=5.0,
    )


def _times(result: SimResult) -> list[tuple[float, float]]:
    out = []
    for r in result.records:
        assert r.outcome == "ok" and r.ended_at is not None
        out.append((round(r.dispatches[0], 6), round(r.ended_at, 6)))
    return sorted(out)


@pytest.mark.parametrize("policy", ["yard", "llama-swap", "ollama", "llama.cpp-router", "localai"])
def test_every_policy_runs_the_slots_and_never_more(policy: str) -> None:
    model = _model(parallel=(1, 2), slot_bytes=GiB, speedup=SPEEDUP)
    seen: list[SimWorld] = []
    result = run(_scenario(model), policy, on_started=lambda _, world: seen.append(world))
    # Ready at 10 s: two at once (12.5 s each at 0.8), the third alone after them.
    assert _times(result) == [(10.0, 22.5), (10.0, 22.5), (22.5, 32.5)]
    assert [p.slots for p in seen[0]._last.values()] == [2]
    assert seen[0].queued_in_process == 0 and result.ooms == []


@pytest.mark.parametrize("policy", ["yard", "localai"])
def test_a_one_slot_model_is_served_one_at_a_time(policy: str) -> None:
    result = run(_scenario(_model(speedup=SPEEDUP)), policy)
    assert _times(result) == [(10.0, 20.0), (20.0, 30.0), (30.0, 40.0)]


def test_yard_starts_only_the_slots_that_fit_and_the_gpu_holds_them() -> None:
    # 8 GiB at one slot, 2 GiB a slot more, x1.1 margin: two slots need 11 GiB, but
    # 10.7 GiB are usable (11 GiB less the 256 MiB reserve): one slot.
    model = _model(parallel=(1, 2), slot_bytes=2 * GiB, speedup=SPEEDUP)
    seen: list[SimWorld] = []
    result = run(
        _scenario(model, gpu_bytes=11 * GiB), "yard", on_started=lambda _, w: seen.append(w)
    )
    assert _times(result) == [(10.0, 20.0), (20.0, 30.0), (30.0, 40.0)]
    assert [p.slots for p in seen[0]._last.values()] == [1]
    assert result.ooms == []
    # On a larger GPU the same model gets both slots, and holds both caches.
    roomy: list[SimWorld] = []
    run(_scenario(model, gpu_bytes=16 * GiB), "yard", on_started=lambda _, w: roomy.append(w))
    assert [p.slots for p in roomy[0]._last.values()] == [2]
    assert roomy[0].profiles["llm"].gpu_per_slot == 2 * GiB


async def test_a_client_that_gives_up_while_served_frees_its_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = _model(speedup=SPEEDUP)
    world = SimWorld(MachineSpec(gpus=(("gpu0", 24 * GiB),)), [model], random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        process = await world.launch("llm", ("gpu0",))
        await process.wait_ready()
        with trio.move_on_after(3.0):
            await world.serve(process.base_url, 10.0)
        assert process.active == 0 and world.ledger.serving == {"gpu0": 0}
        assert await world.serve(process.base_url, 10.0)
        assert trio.current_time() == 23.0 and world.queued_in_process == 0
        nursery.cancel_scope.cancel()


def test_the_slot_days_are_found_by_name_and_only_news_llm_gets_the_range() -> None:
    from sim import scenarios, scenarios_ahead

    for name in (
        "radio-day-1gpu-np2",
        "radio-day-1gpu-np2-announced",
        "radio-day-1gpu-3h-np2-fast-announced",
    ):
        scenario = scenarios.get(name)
        assert scenario.name == name
        news = scenario.model("news-llm")
        assert news.parallel == (1, 2) and news.slot_bytes == scenarios_ahead.NEWS_SLOT_BYTES
        assert all(m.parallel is None for m in scenario.models if m.name != "news-llm")
        assert (scenario.announcements is not None) == name.endswith("-announced")
    plain = scenarios.radio_day(1, hours=3.0)
    slots = scenarios_ahead.radio_day_slots("np2", hours=3.0)
    rng = random.Random(7)
    assert plain.workload(random.Random(7)) == slots.workload(rng)


def test_a_slot_day_slice_serves_news_two_at_once_without_oom() -> None:
    from sim import scenarios_ahead

    scenario = scenarios_ahead.radio_day_slots("np2", hours=3.0, announced=True)
    seen: list[SimWorld] = []
    result = run(scenario, "yard", on_started=lambda _, w: seen.append(w))
    again = run(scenario, "yard")
    assert result.log_digest == again.log_digest
    assert result.ooms == [] and result.stuck == []
    news = [p for p in seen[0]._last.values() if p.name == "news-llm"]
    assert news and news[0].slots == 2 and news[0].most_active == 2
    assert seen[0].queued_in_process == 0
    # The baselines run the same range as a fixed -np 2.
    localai: list[SimWorld] = []
    run(scenario, "localai", on_started=lambda _, w: localai.append(w))
    assert {p.slots for p in localai[0]._last.values() if p.name == "news-llm"} == {2}


def test_the_shared_queueing_floor_shares_the_speed_among_the_slots() -> None:
    from sim.targets_ahead import queueing_floor, shared_waits

    def arrival(at: float, service_s: float) -> Arrival:
        return Arrival(
            at=at, request_id="", backend="x", priority=90, service_s=service_s, cls="high"
        )

    three = [arrival(0.0, 10.0), arrival(0.0, 10.0), arrival(0.0, 10.0)]
    # Two at 0.8 of their speed end at 12.5 s, when the third starts.
    assert shared_waits(three, 2, SPEEDUP) == [0.0, 0.0, 12.5]
    # A join recomputes: the first alone for 5 s, then both at 0.8 (first ends at
    # 11.25); the third waits for it.
    joined = [arrival(0.0, 10.0), arrival(5.0, 10.0), arrival(6.0, 1.0)]
    assert shared_waits(joined, 2, SPEEDUP) == [0.0, 0.0, 5.25]
    # One slot is first come, first served at full speed, as queueing_floor.
    assert shared_waits(three, 1, SPEEDUP) == [0.0, 10.0, 20.0]
    assert queueing_floor(three, {"x": 1}) == 20.0


def test_the_slots_table_reads_only_rows_its_jobs_measure() -> None:
    from sim.targets_ahead import slots_jobs, slots_table

    row = {
        "high_wait_p95_s": 40.0,
        "high_turnaround_p95_s": 150.0,
        "deadlines_met": 192.0,
        "deadlines_missed_avoidable": 0.0,
        "loads": 31.0,
        "loads_lower_bound": 31.0,
        "ooms": 0.0,
        "announced": 48.0,
        "announcements_used": 48.0,
        "loads_news-llm_slots_2": 14.0,
    }
    found = {job: dict(row) for job in slots_jobs([2024])}
    found[("radio-day-1gpu-np2", "ollama", 2024)]["high_wait_p95_s"] = 80.0
    table = slots_table([2024], found)
    assert table.count("\n") == 2 + 2  # header, rule, one row per variant
    assert "| 1-2 (1.2x) | 2024 | 0 ok | 192/192 ok | 31/31 = 1.00 ok | 40 s vs 40 s" in table
    assert "14 x 2, 0 x 1" in table and "MISSED" in table

"""The baselines behave as today's peers do: each drives a small simulated day in
which the peer's documented behaviour shows (sim/baselines.py names the source
file each follows)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from sim.baselines import LlamaCppRouter, LocalAI
from sim.runner import SimResult, run
from sim.workload import Arrival, Scenario
from sim.world import GiB, MachineSpec, ModelSpec, SimWorld


def _model(name: str, gib: float, load_s: float = 10.0, **kw: object) -> ModelSpec:
    spec: dict[str, object] = {
        "name": name,
        "gpu_bytes": int(gib * GiB),
        "load_s": load_s,
        "load_jitter": 0.0,
        "host_bytes": GiB,
    }
    spec.update(kw)
    return ModelSpec(**spec)  # type: ignore[arg-type]


def _day(
    models: Sequence[ModelSpec],
    requests: Sequence[tuple[float, str, float]],
    *,
    gpu_gib: float = 24.0,
    meter_s: float = 5.0,
) -> Scenario:
    """One GPU, the models, and ``(at, backend, service_s)`` requests named r01, r02..."""
    arrivals = [
        Arrival(
            at=at,
            request_id=f"r{i:02d}",
            backend=backend,
            priority=50.0,
            service_s=service_s,
            cls="normal",
        )
        for i, (at, backend, service_s) in enumerate(requests, start=1)
    ]

    def workload(rng: random.Random) -> list[Arrival]:
        return list(arrivals)

    return Scenario(
        name="peers-day",
        title="a small day for one peer's behaviour",
        machine=MachineSpec(gpus=(("gpu0", int(gpu_gib * GiB)),), reserve_bytes=0),
        models=tuple(models),
        workload=workload,
        horizon_s=7200.0,
        meter_interval_s=meter_s,
    )


def _order(result: SimResult) -> list[str]:
    return [backend for _, backend in result.dispatch_order]


def _outcomes(result: SimResult) -> dict[str, str]:
    return {r.arrival.request_id: r.outcome or "open" for r in result.records}


# -- llama-swap --------------------------------------------------------------------


def test_llama_swap_groups_queued_requests_by_model() -> None:
    # One model fits at a time: A B C A B C arriving together runs as A A B B C C,
    # with three loads (the old baseline swapped on every request: six).
    models = [_model(m, 14.0) for m in "abc"]
    requests = [(float(i), m, 5.0) for i, m in enumerate("abcabc")]
    result = run(_day(models, requests), "llama-swap")
    assert _order(result) == list("aabbcc")
    assert [b for _, b, _ in result.launches] == ["a", "b", "c"]


def test_llama_swap_never_stops_a_model_serving_requests() -> None:
    # b needs a's room; a is serving a 100 s request, so b waits for it to end.
    models = [_model("a", 14.0), _model("b", 14.0)]
    result = run(_day(models, [(0.0, "a", 100.0), (20.0, "b", 5.0)]), "llama-swap")
    assert _outcomes(result) == {"r01": "ok", "r02": "ok"}
    a_started = result.dispatch_order[0][0]
    b_start = next(t for t, b, _ in result.launches if b == "b")
    assert b_start >= a_started + 100.0


def test_llama_swap_matrix_stops_the_set_with_the_lowest_evict_cost() -> None:
    # a (40 s to load) and b (5 s) are loaded; c fits beside either, not both.
    # b was used last, yet it goes: its evict cost (its load time) is lower.
    models = [_model("a", 9.0, load_s=40.0), _model("b", 9.0, load_s=5.0), _model("c", 9.0)]
    requests = [(0.0, "a", 1.0), (60.0, "b", 1.0), (120.0, "c", 1.0)]
    result = run(_day(models, requests), "llama-swap", keep_log=True)
    assert result.log is not None
    stops = [line for line in result.log if "StopBackend" in line]
    assert len(stops) == 1 and "backend='b'" in stops[0]


def test_llama_swap_refuses_past_its_concurrency_limit() -> None:
    # concurrencyLimit defaults to 10 requests per model (queued or served).
    models = [_model("a", 4.0, slots=2)]
    requests = [(0.0, "a", 30.0)] * 11
    result = run(_day(models, requests), "llama-swap")
    refused = [r for r in result.records if r.outcome == "rejected"]
    assert [r.code for r in refused] == ["too_many_requests"]
    assert refused[0].arrival.request_id == "r11"


# -- Ollama ------------------------------------------------------------------------


def test_ollama_evicts_when_the_prediction_passes_80_percent_of_free() -> None:
    # a (10 GiB) is loaded and idle on 20 GiB: b's 9 GiB fit in the 10 free, but 9
    # is above 80 % of 10, so a is unloaded first; c (7 GiB) then fits beside b.
    models = [_model("a", 10.0), _model("b", 9.0), _model("c", 7.0)]
    requests = [(0.0, "a", 1.0), (60.0, "b", 1.0), (120.0, "c", 1.0)]
    result = run(_day(models, requests, gpu_gib=20.0), "ollama", keep_log=True)
    assert result.log is not None
    stops = [line for line in result.log if "StopBackend" in line]
    assert len(stops) == 1 and "backend='a'" in stops[0]
    assert [b for _, b, _ in result.launches] == ["a", "b", "c"]


def test_ollama_records_the_real_size_after_loading() -> None:
    # a says 4 GiB but holds 10 after its first request; Ollama's free memory is
    # the reading's, so b (8 GiB: 80 % of the 10 left) can load beside it only
    # until a grew; after that b's load unloads a.
    models = [_model("a", 4.0, growth_bytes=6 * GiB), _model("b", 8.5)]
    requests = [(0.0, "a", 1.0), (60.0, "b", 1.0)]
    result = run(_day(models, requests, gpu_gib=20.0), "ollama", keep_log=True)
    assert result.log is not None
    assert any("StopBackend" in line and "backend='a'" in line for line in result.log)
    assert not result.ooms


def test_ollama_keeps_at_most_three_models_per_gpu_and_waits_in_order() -> None:
    # Four small models: the fourth load unloads one (the first idle by name), and
    # the request behind it, for a loaded model, waits until that load is under way.
    models = [_model(m, 2.0) for m in "abcd"]
    requests = [(0.0, "a", 1.0), (20.0, "b", 1.0), (40.0, "c", 1.0), (60.0, "d", 1.0)]
    requests += [(60.5, "b", 1.0)]
    result = run(_day(models, requests), "ollama", keep_log=True)
    assert result.log is not None
    stops = [line for line in result.log if "StopBackend" in line]
    assert len(stops) == 1 and "backend='a'" in stops[0]
    d_start = next(t for t, b, _ in result.launches if b == "d")
    b_second = next(r for r in result.records if r.arrival.request_id == "r05")
    assert b_second.dispatches[0] >= d_start


def test_ollama_unloads_an_idle_model_after_its_keep_alive() -> None:
    # a's request ends at 11 s (10 s load, 1 s of work); b keeps the day going.
    models = [_model("a", 2.0), _model("b", 2.0)]
    result = run(_day(models, [(0.0, "a", 1.0), (400.0, "b", 1.0)]), "ollama", keep_log=True)
    assert result.log is not None
    stops = [line for line in result.log if "StopBackend" in line]
    assert len(stops) == 1 and "keep-alive" in stops[0] and "backend='a'" in stops[0]
    assert float(stops[0].split()[0]) == 10.0 + 1.0 + 300.0


# -- llama.cpp's router --------------------------------------------------------------


class _Max2(LlamaCppRouter):
    models_max = 2


def test_llama_cpp_router_unloads_the_least_recently_used_even_if_busy() -> None:
    # --models-max 2: c's load unloads a, whose last request (a long one, at 0 s)
    # is older than b's; a's request dies with it.
    models = [_model(m, 4.0) for m in "abc"]
    requests = [(0.0, "a", 300.0), (20.0, "b", 1.0), (40.0, "c", 1.0)]
    scenario = _day(models, requests)
    from sim import baselines

    baselines.BASELINES["llama.cpp-router-2"] = _Max2
    try:
        result = run(scenario, "llama.cpp-router-2", keep_log=True)
    finally:
        del baselines.BASELINES["llama.cpp-router-2"]
    assert result.log is not None
    stops = [line for line in result.log if "StopBackend" in line]
    assert len(stops) == 1 and "backend='a'" in stops[0]
    assert _outcomes(result) == {"r01": "rejected", "r02": "ok", "r03": "ok"}


def test_llama_cpp_router_fit_shrinks_the_context_then_spills_to_host() -> None:
    # 24 GiB: a holds 16; b (8 GiB, 2 of them KV cache at 16k tokens) finds 8 free,
    # 7 after the 1 GiB margin: its context shrinks by 1 GiB (it could go to 4k
    # tokens, 1.5 GiB less) and it fits. c (6 GiB, no KV cache to shrink) then finds
    # 1 GiB free, nothing after the margin: all of it goes to host memory and it
    # serves 12.5 times slower.
    models = [
        _model("a", 16.0),
        _model("b", 8.0, kv_bytes=2 * GiB, context_tokens=16384),
        _model("c", 6.0),
    ]
    worlds: list[SimWorld] = []
    requests = [(0.0, "a", 1.0), (30.0, "b", 1.0), (60.0, "c", 10.0)]
    result = run(
        _day(models, requests), "llama.cpp-router", on_started=lambda _, w: worlds.append(w)
    )
    world = worlds[0]
    b, c = world._last["b"], world._last["c"]
    assert b.shrunk == GiB and b.slowdown == 1.0
    assert c.shrunk == 6 * GiB and c.slowdown == 12.5
    assert not result.ooms
    served = next(r for r in result.records if r.arrival.backend == "c")
    assert served.ended_at is not None and served.ended_at - served.dispatches[0] > 110.0


# -- LocalAI -------------------------------------------------------------------------


def test_localai_waits_for_a_busy_backend_then_evicts_it() -> None:
    # --max-active-backends 1: b's load waits while a serves (retrying each
    # second), then a is evicted and b loads.
    def one(
        devices: Any, backends: Any, sizes: Mapping[str, int], load_s: Mapping[str, float]
    ) -> LocalAI:
        return LocalAI(devices, backends, sizes, load_s, max_active=1)

    from sim import baselines

    baselines.BASELINES["localai-1"] = one
    models = [_model("a", 4.0), _model("b", 4.0)]
    try:
        result = run(_day(models, [(0.0, "a", 20.0), (12.0, "b", 1.0)]), "localai-1")
        slow = run(_day(models, [(0.0, "a", 100.0), (12.0, "b", 1.0)]), "localai-1")
    finally:
        del baselines.BASELINES["localai-1"]
    b_start = next(t for t, b, _ in result.launches if b == "b")
    assert 30.0 <= b_start <= 31.0 + 1.0  # a's request ends at 30 s
    assert _outcomes(result) == {"r01": "ok", "r02": "ok"}
    # With a busy past the 30 retries, b loads anyway beside it.
    b_start = next(t for t, b, _ in slow.launches if b == "b")
    assert 12.0 + 29.0 <= b_start <= 12.0 + 31.0


def test_localai_reclaimer_evicts_the_least_recently_used_over_80_percent() -> None:
    # 20 GiB: a (8) then b (9) make 17 GiB, 85 %: at the next reading the
    # reclaimer evicts a, the least recently used and idle.
    models = [_model("a", 8.0), _model("b", 9.0)]
    result = run(
        _day(models, [(0.0, "a", 1.0), (30.0, "b", 1.0)], gpu_gib=20.0), "localai", keep_log=True
    )
    assert result.log is not None
    stops = [line for line in result.log if "StopBackend" in line]
    assert stops and "backend='a'" in stops[0] and "reclaimer" in stops[0]

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from quart_trio import QuartTrio

from yard.core.decisions import Dispatch, Reject
from yard.observe import observe_proxy_latency, observe_request
from yard.observe.metrics import priority_class
from yard.testing.engine import FakeEngine, GiB, queued_view, statistics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(app: QuartTrio) -> Samples:
    """GET /metrics (open to anybody) and parse it with prometheus_client's parser."""
    response = await app.test_client().get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = await response.get_data(as_text=True)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_show_memory_per_device_and_backend(app: QuartTrio) -> None:
    samples = await scrape(app)
    gpu = (("device", "gpu0"), ("kind", "gpu"))
    assert samples[("yard_device_total_bytes", gpu)] == 24 * GiB
    assert samples[("yard_device_free_bytes", gpu)] == 16 * GiB
    assert samples[("yard_device_foreign_bytes", gpu)] == 2 * GiB
    assert samples[("yard_device_committed_bytes", gpu)] == 5 * GiB
    assert samples[("yard_backend_live_bytes", (("backend", "llm"), ("device", "gpu0")))] == (
        3 * GiB
    )
    llm_gpu = (("backend", "llm"), ("kind", "gpu"))
    assert samples[("yard_backend_profile_bytes", llm_gpu)] == 4 * GiB
    assert samples[("yard_backend_reservation_bytes", llm_gpu)] == 5 * GiB
    assert samples[("yard_backend_state", (("backend", "llm"), ("state", "ready")))] == 1
    assert samples[("yard_backend_state", (("backend", "llm"), ("state", "busy")))] == 0
    assert samples[("yard_backend_state", (("backend", "tts"), ("state", "stopped")))] == 1


async def test_queue_length_is_counted_by_priority_class(
    app: QuartTrio, engine: FakeEngine
) -> None:
    engine.queue = [
        queued_view("a", "llm", priority=50),
        queued_view("b", "llm", priority=55.5),
        queued_view("c", "tts", priority=90, start_by=30.0),
    ]
    samples = await scrape(app)
    assert samples[("yard_queue_length", (("priority_class", "50-59"),))] == 2
    assert samples[("yard_queue_length", (("priority_class", "90-99"),))] == 1
    assert samples[("yard_queue_requests", ())] == 3
    assert samples[("yard_queue_deadline_requests", ())] == 1
    assert priority_class(0) == "0-9"
    assert priority_class(100) == "100-109"


async def test_engine_counters_move_as_requests_are_served(
    app: QuartTrio, engine: FakeEngine
) -> None:
    engine.stats = statistics(loads=1, requests={"ok": 3}, rejects={"queue_full": 1})
    before = await scrape(app)
    assert before[("yard_loads_total", ())] == 1
    assert before[("yard_requests_ended_total", (("outcome", "ok"),))] == 3
    assert before[("yard_rejects_total", (("code", "queue_full"),))] == 1
    engine.stats = statistics(
        loads=2, evictions=1, ooms=1, requeues=1, deadline_misses=1, requests={"ok": 5}
    )
    after = await scrape(app)
    assert after[("yard_loads_total", ())] == 2
    assert after[("yard_requests_ended_total", (("outcome", "ok"),))] == 5
    for name in ("evictions", "ooms", "requeues", "deadline_misses"):
        assert after[(f"yard_{name}_total", ())] == 1


async def test_each_decision_is_counted_once_across_scrapes(
    app: QuartTrio, engine: FakeEngine
) -> None:
    engine.decide(Dispatch(reason="idle", request_id="r1", backend="llm"))
    engine.decide(Dispatch(reason="idle", request_id="r2", backend="llm"))
    first = await scrape(app)
    assert first[("yard_decisions_total", (("backend", "llm"), ("kind", "dispatch")))] == 2
    again = await scrape(app)
    assert again[("yard_decisions_total", (("backend", "llm"), ("kind", "dispatch")))] == 2
    engine.decide(
        Reject(reason="late", request_id="r3", status=504, code="deadline_missed", message="late")
    )
    last = await scrape(app)
    assert last[("yard_decisions_total", (("backend", "llm"), ("kind", "dispatch")))] == 2
    assert last[("yard_decisions_total", (("backend", ""), ("kind", "reject")))] == 1


async def test_each_finished_load_is_observed_once(app: QuartTrio, engine: FakeEngine) -> None:
    label = (("backend", "llm"),)
    # The fixture's llm was loaded (in 12.5 s) before the first scrape.
    assert (await scrape(app))[("yard_load_seconds_count", label)] == 1
    engine.set_backend("llm", loaded_at=40.0, last_load_s=7.5)
    samples = await scrape(app)
    assert samples[("yard_load_seconds_count", label)] == 2
    assert samples[("yard_load_seconds_sum", label)] == 20.0
    assert (await scrape(app))[("yard_load_seconds_count", label)] == 2


async def test_gateway_hooks_feed_requests_queue_wait_and_latency(app: QuartTrio) -> None:
    model = (("backend", "llm"), ("model", "hook-model"), ("outcome", "ok"))
    llm = (("backend", "llm"),)
    before = await scrape(app)
    observe_request(model="hook-model", backend="llm", outcome="ok", queued_s=0.2, latency_s=1.5)
    observe_proxy_latency(0.5, backend="llm")
    after = await scrape(app)
    assert (
        after[("yard_requests_total", model)] - before.get(("yard_requests_total", model), 0) == 1
    )
    waited = after[("yard_queue_wait_seconds_count", llm)]
    assert waited - before.get(("yard_queue_wait_seconds_count", llm), 0) == 1
    latency = after[("yard_proxy_latency_seconds_count", llm)]
    assert latency - before.get(("yard_proxy_latency_seconds_count", llm), 0) == 2

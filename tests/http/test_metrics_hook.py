"""The metrics hook the gateway calls once per request: its cached children
count exactly as the labelled ones would."""

from __future__ import annotations

from yard.observe.metrics import PROXY_LATENCY, QUEUE_WAIT, REQUESTS, observe_request


def _value(metric: object, name: str, labels: dict[str, str]) -> float:
    for family in metric.collect():  # type: ignore[attr-defined]
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def test_repeated_requests_with_the_same_labels_each_count_once() -> None:
    labels = {"model": "hook-cache-m", "backend": "hook-cache-b", "outcome": "ok"}
    before = _value(REQUESTS, "yard_requests_total", labels)
    for _ in range(3):
        observe_request(model="hook-cache-m", backend="hook-cache-b", outcome="ok")
    observe_request(model="hook-cache-m", backend="hook-cache-b", outcome="queue_full")
    assert _value(REQUESTS, "yard_requests_total", labels) == before + 3
    assert _value(REQUESTS, "yard_requests_total", {**labels, "outcome": "queue_full"}) == 1.0


def test_queue_wait_and_latency_land_in_their_backends_histograms() -> None:
    observe_request(model="m", backend="hook-hist-a", outcome="ok", queued_s=0.02, latency_s=0.3)
    observe_request(model="m", backend="hook-hist-a", outcome="ok", queued_s=0.02, latency_s=0.3)
    observe_request(model="m", backend="hook-hist-b", outcome="ok", queued_s=-1.0)
    assert _value(QUEUE_WAIT, "yard_queue_wait_seconds_count", {"backend": "hook-hist-a"}) == 2
    assert _value(QUEUE_WAIT, "yard_queue_wait_seconds_sum", {"backend": "hook-hist-a"}) == (0.04)
    # A negative wait (clock skew) counts as zero.
    assert _value(QUEUE_WAIT, "yard_queue_wait_seconds_sum", {"backend": "hook-hist-b"}) == 0.0
    assert (
        _value(PROXY_LATENCY, "yard_proxy_latency_seconds_count", {"backend": "hook-hist-a"}) == 2
    )
    assert (
        _value(PROXY_LATENCY, "yard_proxy_latency_seconds_count", {"backend": "hook-hist-b"}) == 0
    )

"""``/metrics``: yard in the Prometheus text format.

Three sources, one registry per app:

- :class:`EngineCollector` reads the engine at scrape time: queue length by
  priority class, memory per device and per backend (profile and live),
  backend states, and the counters of ``engine.statistics()``.
- :class:`DecisionMetrics` reads the engine's decision log at scrape time:
  decisions by kind and the load-time histogram.
- Process-wide histograms fed by the gateway through hooks, because only the
  gateway sees a request end to end: :func:`observe_request` (requests by
  model and outcome, queue wait, proxy latency) and
  :func:`observe_proxy_latency`.

The series:

- queue: ``yard_queue_length{priority_class}``, ``yard_queue_requests``,
  ``yard_queue_deadline_requests``, ``yard_queue_wait_seconds{backend}``.
- requests: ``yard_requests_total{model,backend,outcome}`` (gateway),
  ``yard_requests_ended_total{outcome}``, ``yard_rejects_total{code}``,
  ``yard_submitted_total``, ``yard_deadline_misses_total``,
  ``yard_requeues_total``, ``yard_inflight``,
  ``yard_proxy_latency_seconds{backend}``.
- apps: ``yard_refusals_total{app,reason}`` (refused or ended unserved, by
  error code: ``app_queue_full``, ``queue_full``, ``deadline_missed``, ...),
  ``yard_app_queued{app}``, ``yard_app_inflight{app}``.
- backends: ``yard_loads_total``, ``yard_load_failures_total``,
  ``yard_load_seconds{backend}``, ``yard_stops_total``,
  ``yard_evictions_total``, ``yard_ooms_total``, ``yard_backends_running``,
  ``yard_backend_state{backend,state}``, ``yard_backend_inflight``,
  ``yard_backend_slots``, ``yard_backend_served``,
  ``yard_backend_last_load_seconds``.
- memory: ``yard_device_{total,reserve,committed,live,foreign,free}_bytes
  {device,kind}``, ``yard_backend_live_bytes{backend,device}``,
  ``yard_backend_profile_bytes{backend,kind}``,
  ``yard_backend_reservation_bytes{backend,kind}``, ``yard_device_per_process
  {device,kind}`` (0 where the meter credits backends by device deltas).
- the engine loop: ``yard_decisions_total{kind,backend}``, ``yard_engine_events_total``,
  ``yard_engine_decisions_total``.
- the meter: ``yard_meter_info{mode,detail}`` (always 1): which memory meter
  yard uses (``nvml``, ``drm``, ``nvml+drm``, ``apple``, ``host-only``) and
  its sentence (which GPUs, or why none).
- the HTTP server's limits: ``yard_http_connections{state}``,
  ``yard_http_max_connections``, ``yard_http_connections_closed_total{reason}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from yard.observe.report import EngineSource, backend_display_state, decision_kind

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from yard.core.views import Snapshot
    from yard.engine import EngineStatistics, LoggedDecision
    from yard.h1.server import ServerStatistics

BACKEND_STATES = ("stopped", "starting", "ready", "busy", "draining", "stopping", "failed")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_LOAD_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)

_PROCESS_REGISTRY = CollectorRegistry(auto_describe=True)

PROXY_LATENCY = Histogram(
    "yard_proxy_latency_seconds",
    "Time from dispatch to the end of the backend's response, per backend.",
    ["backend"],
    buckets=_LATENCY_BUCKETS,
    registry=_PROCESS_REGISTRY,
)
QUEUE_WAIT = Histogram(
    "yard_queue_wait_seconds",
    "Time requests spent queued before dispatch, per backend.",
    ["backend"],
    buckets=_WAIT_BUCKETS,
    registry=_PROCESS_REGISTRY,
)
REQUESTS = Counter(
    "yard_requests",
    "Requests that went through the gateway, by model and outcome "
    "(ok, error, upstream_lost, or the rejection code).",
    ["model", "backend", "outcome"],
    registry=_PROCESS_REGISTRY,
)


# The labelled children, looked up once per label set: ``labels()`` takes
# the metric's lock and validates its arguments every time (about 8 µs of a
# proxied request's CPU; a dict lookup is a fraction of a µs). Label values
# come from the configuration and a fixed set of outcomes, but the caches
# are bounded all the same: past the limit, children are looked up each time.
_CACHE_LIMIT = 4096
_REQUEST_CHILDREN: dict[tuple[str, str, str], Counter] = {}
_WAIT_CHILDREN: dict[str, Histogram] = {}
_LATENCY_CHILDREN: dict[str, Histogram] = {}


def _child(cache: dict[Any, Any], key: object, make: Callable[[], Any]) -> Any:
    child = cache.get(key)
    if child is None:
        child = make()
        if len(cache) < _CACHE_LIMIT:
            cache[key] = child
    return child


def observe_proxy_latency(seconds: float, *, backend: str = "") -> None:
    """Record one proxied request's latency (dispatch to the end of the response).

    The gateway calls this once per finished request; it never blocks.
    """
    child: Histogram = _child(
        _LATENCY_CHILDREN, backend, lambda: PROXY_LATENCY.labels(backend=backend)
    )
    child.observe(max(0.0, seconds))


def observe_request(
    *,
    model: str,
    backend: str,
    outcome: str,
    queued_s: float | None = None,
    latency_s: float | None = None,
) -> None:
    """Record one request that ended at the gateway.

    outcome: ``ok``, ``error``, ``upstream_lost``, or the code it was rejected
        with (``deadline_missed``, ``queue_full``...).
    queued_s: time from arrival to dispatch (``Admission.queued_s``); None when
        it was never dispatched.
    latency_s: dispatch to the end of the response; None when not proxied.
    """
    key = (model, backend, outcome)
    counter = _REQUEST_CHILDREN.get(key)
    if counter is None:
        counter = _child(
            _REQUEST_CHILDREN,
            key,
            lambda: REQUESTS.labels(model=model, backend=backend, outcome=outcome),
        )
    counter.inc()
    if queued_s is not None:
        wait: Histogram = _child(
            _WAIT_CHILDREN, backend, lambda: QUEUE_WAIT.labels(backend=backend)
        )
        wait.observe(max(0.0, queued_s))
    if latency_s is not None:
        observe_proxy_latency(latency_s, backend=backend)


def priority_class(priority: float) -> str:
    """The bucket a base priority falls in: ``"50-59"`` for 50 <= p < 60."""
    low = math.floor(priority / 10.0) * 10
    return f"{low}-{low + 9}"


class EngineCollector(Collector):
    """Reads the engine when Prometheus scrapes; nothing is cached."""

    def __init__(self, engine: EngineSource, *, profile_margin: float) -> None:
        self._engine = engine
        self._margin = profile_margin

    def collect(self) -> Iterator[Metric]:
        snapshot = self._engine.snapshot(limit=1_000_000)
        yield from self._queue(snapshot)
        yield from self._devices(snapshot)
        yield from self._backends(snapshot)
        yield from self._statistics()

    def _queue(self, snapshot: Snapshot) -> Iterator[Metric]:
        length = GaugeMetricFamily(
            "yard_queue_length",
            "Requests waiting, by base priority class.",
            labels=["priority_class"],
        )
        counts: dict[str, int] = {}
        deadlines = 0
        for item in snapshot.queue:
            key = priority_class(item.priority)
            counts[key] = counts.get(key, 0) + 1
            deadlines += item.start_by is not None
        for key in sorted(counts):
            length.add_metric([key], counts[key])
        yield length
        total = GaugeMetricFamily("yard_queue_requests", "Requests waiting, all classes.")
        total.add_metric([], snapshot.queue_length)
        yield total
        with_deadline = GaugeMetricFamily(
            "yard_queue_deadline_requests", "Requests waiting that carry a start-by deadline."
        )
        with_deadline.add_metric([], deadlines)
        yield with_deadline

    def _devices(self, snapshot: Snapshot) -> Iterator[Metric]:
        fields = {
            "total": "Capacity of the device.",
            "reserve": "Kept free at all times.",
            "committed": "Reserved for loaded and loading backends.",
            "live": "Measured use of yard's backends.",
            "foreign": "Used by processes yard does not own.",
            "free": "Free for new backends.",
        }
        families = {
            name: GaugeMetricFamily(f"yard_device_{name}_bytes", text, labels=["device", "kind"])
            for name, text in fields.items()
        }
        for device in snapshot.devices:
            values = {
                "total": device.total_bytes,
                "reserve": device.reserve_bytes,
                "committed": device.committed_bytes,
                "live": sum(device.live_bytes.values()),
                "foreign": device.foreign_bytes,
                "free": device.free_bytes,
            }
            for name, value in values.items():
                families[name].add_metric([device.name, device.kind], value)
        yield from families.values()
        attributable = GaugeMetricFamily(
            "yard_device_per_process",
            "1 where the meter tells backends' memory apart per process; 0 where it "
            "credits them with device deltas (then a first load there goes alone).",
            labels=["device", "kind"],
        )
        for device in snapshot.devices:
            attributable.add_metric([device.name, device.kind], int(device.per_process))
        yield attributable
        live = GaugeMetricFamily(
            "yard_backend_live_bytes",
            "Measured memory of a backend's process tree, per device.",
            labels=["backend", "device"],
        )
        for device in snapshot.devices:
            for backend, value in sorted(device.live_bytes.items()):
                live.add_metric([backend, device.name], value)
        yield live

    def _backends(self, snapshot: Snapshot) -> Iterator[Metric]:
        profile = GaugeMetricFamily(
            "yard_backend_profile_bytes",
            "Measured peak memory of a backend (margin not applied), per kind of device.",
            labels=["backend", "kind"],
        )
        reserved = GaugeMetricFamily(
            "yard_backend_reservation_bytes",
            "Profile times the margin: what the scheduler reserves, per kind of device.",
            labels=["backend", "kind"],
        )
        state = GaugeMetricFamily(
            "yard_backend_state", "1 for the state the backend is in.", labels=["backend", "state"]
        )
        inflight = GaugeMetricFamily(
            "yard_backend_inflight", "Requests in flight.", labels=["backend"]
        )
        slots = GaugeMetricFamily(
            "yard_backend_slots", "Requests served at once.", labels=["backend"]
        )
        served = GaugeMetricFamily(
            "yard_backend_served", "Requests served since the last load.", labels=["backend"]
        )
        load = GaugeMetricFamily(
            "yard_backend_last_load_seconds", "Duration of the last load.", labels=["backend"]
        )
        for view in snapshot.backends:
            if view.profile is not None:
                for kind, value in (
                    ("gpu", view.profile.gpu_bytes),
                    ("host", view.profile.host_bytes),
                ):
                    profile.add_metric([view.name, kind], value)
                    reserved.add_metric([view.name, kind], int(value * self._margin))
            current = backend_display_state(view)
            for name in BACKEND_STATES:
                state.add_metric([view.name, name], 1.0 if name == current else 0.0)
            inflight.add_metric([view.name], view.inflight)
            slots.add_metric([view.name], view.slots)
            served.add_metric([view.name], view.served)
            if view.last_load_s is not None:
                load.add_metric([view.name], view.last_load_s)
        yield from (profile, reserved, state, inflight, slots, served, load)

    def _statistics(self) -> Iterator[Metric]:
        stats = self._engine.statistics()
        ended = CounterMetricFamily(
            "yard_requests_ended",
            "Requests the engine saw end, by outcome (ok, error, rejected, cancelled).",
            labels=["outcome"],
        )
        for outcome, count in sorted(stats.requests.items()):
            ended.add_metric([outcome], count)
        yield ended
        rejects = CounterMetricFamily(
            "yard_rejects", "Requests the scheduler refused or ended, by code.", labels=["code"]
        )
        for code, count in sorted(stats.rejects.items()):
            rejects.add_metric([code], count)
        yield rejects
        yield from _apps(stats)
        counters = {
            "submitted": (stats.submitted, "Requests handed to the engine."),
            "loads": (stats.loads, "Backend starts ordered."),
            "load_failures": (stats.load_failures, "Backend starts that never became ready."),
            "stops": (stats.stops, "Backend stops ordered (any reason)."),
            "evictions": (stats.evictions, "Backend stops ordered to make room for waiting work."),
            "ooms": (stats.ooms, "Backends that died or failed to start out of memory."),
            "requeues": (stats.requeues, "Requests requeued after a self-caused out-of-memory."),
            "deadline_misses": (stats.deadline_misses, "Requests ended with deadline_missed."),
            "engine_events": (stats.events, "Events the engine loop handled."),
            "engine_decisions": (stats.decisions, "Decisions the engine carried out."),
        }
        for name, (value, text) in counters.items():
            counter = CounterMetricFamily(f"yard_{name}", text)
            counter.add_metric([], value)
            yield counter
        gauges = {
            "inflight": (stats.inflight, "Requests dispatched and not yet finished."),
            "backends_running": (stats.backends_running, "Backend processes held by yard."),
        }
        for name, (value, text) in gauges.items():
            gauge = GaugeMetricFamily(f"yard_{name}", text)
            gauge.add_metric([], value)
            yield gauge


def _apps(stats: EngineStatistics) -> Iterator[Metric]:
    """Refusals and waiting / served requests by app (apps with none left out)."""
    refusals = CounterMetricFamily(
        "yard_refusals",
        "Requests refused or ended unserved, by app and reason (the error code: "
        "app_queue_full, queue_full, deadline_missed, ...).",
        labels=["app", "reason"],
    )
    for app, codes in sorted(stats.refusals.items()):
        for code, count in sorted(codes.items()):
            refusals.add_metric([app, code], count)
    yield refusals
    for name, counts, text in (
        ("queued", stats.queued_by_app, "Requests of the app waiting (max_queued counts these)."),
        ("inflight", stats.inflight_by_app, "Requests of the app being served."),
    ):
        gauge = GaugeMetricFamily(f"yard_app_{name}", text, labels=["app"])
        for app, count in sorted(counts.items()):
            gauge.add_metric([app], count)
        yield gauge


class DecisionMetrics:
    """Counters and histograms fed from the engine's decision log."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "yard_decisions",
            "Decisions the scheduler made, by kind (load, stop, dispatch, reject, requeue, "
            "flag) and backend (empty for a reject or requeue, which name a request).",
            ["kind", "backend"],
            registry=registry,
        )
        self.load_time = Histogram(
            "yard_load_seconds",
            "Time from start to ready of each backend load (warm-up included).",
            ["backend"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self._seen_loads: dict[str, float] = {}
        self._last: LoggedDecision | None = None

    def record(self, logged: LoggedDecision) -> None:
        """Count one decision."""
        backend = getattr(logged.decision, "backend", None) or ""
        self.decisions.labels(kind=decision_kind(logged.decision), backend=backend).inc()

    def check_loads(self, engine: EngineSource) -> None:
        """Observe the load time of every load completed since the last call."""
        for view in engine.snapshot(limit=0).backends:
            if view.loaded_at is None or view.last_load_s is None:
                continue
            if view.state in ("stopped", "failed", "starting"):
                continue
            if self._seen_loads.get(view.name) != view.loaded_at:
                self._seen_loads[view.name] = view.loaded_at
                self.load_time.labels(backend=view.name).observe(view.last_load_s)

    def catch_up(self, engine: EngineSource) -> None:
        """Count the decisions logged since the last call, and observe the
        loads finished since then. Called at each scrape: the engine's log
        holds its last ``log_size`` decisions, far more than a scrape
        interval sees."""
        log = engine.decisions()
        start = 0
        if self._last is not None:
            # The newest entry we counted, searched from the end; if it has
            # left the log, everything in the log is new.
            for index in range(len(log) - 1, -1, -1):
                if log[index] == self._last:
                    start = index + 1
                    break
        for logged in log[start:]:
            self.record(logged)
        if log:
            self._last = log[-1]
        self.check_loads(engine)


class MeterCollector(Collector):
    """``yard_meter_info``: the memory meter in use, read at scrape time from
    ``meter()`` (a mapping with ``mode`` and ``detail``, or None: no meter)."""

    def __init__(self, meter: Callable[[], Mapping[str, str] | None]) -> None:
        self._meter = meter

    def collect(self) -> Iterator[Metric]:
        found = self._meter()
        if found is None:
            return
        info = GaugeMetricFamily(
            "yard_meter_info",
            "The memory meter in use (nvml, drm, nvml+drm, apple, host-only) and its sentence.",
            labels=["mode", "detail"],
        )
        info.add_metric([found.get("mode", ""), found.get("detail", "")], 1)
        yield info


class HttpCollector(Collector):
    """What the HTTP server's connection limits did (issue 10), read at scrape
    time from ``statistics()`` (None until the server serves):
    ``yard_http_connections{state}`` (open, waiting on their client),
    ``yard_http_max_connections`` (the cap in force) and
    ``yard_http_connections_closed_total{reason}`` (evicted at the cap, refused
    503, head/body/send timeouts, idle keep-alive closes)."""

    def __init__(self, statistics: Callable[[], ServerStatistics | None]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()
        if stats is None:
            return
        now = GaugeMetricFamily(
            "yard_http_connections",
            "Client connections now: open (served in full or from the reserve) and waiting "
            "(on their client for a head or body: the ones the cap may close).",
            labels=["state"],
        )
        now.add_metric(["open"], stats.open_connections)
        now.add_metric(["waiting"], stats.waiting_connections)
        yield now
        yield GaugeMetricFamily(
            "yard_http_max_connections",
            "The connection cap in force ([server] max_connections, lowered to fit the "
            "open-file limit).",
            value=stats.max_connections,
        )
        closed = CounterMetricFamily(
            "yard_http_connections_closed",
            "Connections the limits ended since the start, by reason.",
            labels=["reason"],
        )
        for reason, count in (
            ("evicted", stats.evicted),
            ("refused", stats.refused),
            ("head_timeout", stats.head_timeouts),
            ("idle", stats.idle_closed),
            ("body_timeout", stats.body_timeouts),
            ("send_timeout", stats.send_timeouts),
        ):
            closed.add_metric([reason], count)
        yield closed


def new_registry(
    engine: EngineSource,
    *,
    profile_margin: float,
    meter: Callable[[], Mapping[str, str] | None] | None = None,
    http: Callable[[], ServerStatistics | None] | None = None,
) -> tuple[CollectorRegistry, DecisionMetrics]:
    """A registry with everything ``/metrics`` shows for one engine;
    ``meter`` tells which memory meter yard uses (:class:`MeterCollector`),
    ``http`` what the HTTP server's limits did (:class:`HttpCollector`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, profile_margin=profile_margin))
    if meter is not None:
        registry.register(MeterCollector(meter))
    if http is not None:
        registry.register(HttpCollector(http))
    registry.register(_PROCESS_REGISTRY)
    return registry, DecisionMetrics(registry)

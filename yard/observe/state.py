"""The observability side of one running yard: what the views share."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

import trio
from prometheus_client import CollectorRegistry
from quart import current_app, request

from yard.api.keys import LoginThrottle, bearer_key
from yard.errors import Rejected
from yard.observe import auth, timeline
from yard.observe.cluster import NodeCollector
from yard.observe.metrics import DecisionMetrics, new_registry
from yard.observe.report import EngineSource, Json, apps_json, build_status
from yard.observe.timeline_svg import render_svg

if TYPE_CHECKING:
    from yard.config import Config
    from yard.h1.server import ServerStatistics


@dataclass(frozen=True, slots=True, kw_only=True)
class MeterInfo:
    """Which memory meter yard reads, for the parts that show it.

    mode: ``nvml``, ``drm``, ``nvml+drm``, ``apple`` or ``host-only``.
    detail: the meter's sentence (which GPUs, through what; or why host-only).
    """

    mode: str
    detail: str


class ProfileForgetter(Protocol):
    """The part of ``yard.ports.ProfileStore`` the admin API uses."""

    async def forget(self, backend: str) -> None: ...


@dataclass(kw_only=True)
class Observer:
    """Everything the dashboard, the admin API and ``/metrics`` read.

    engine: the running engine.
    admin_key: ``server.admin_key`` (None: admin from loopback only).
    models: backend name -> model names it serves.
    profile_margin: the scheduler's factor from profile to reservation.
    started_at: wall-clock time yard started serving.
    profiles: the profile store, when yard keeps one.
    shutdown: set when yard begins to shut down; it ends the endless streams
        (dashboard events, log tails) at once instead of holding the
        shutdown's grace (None: they end only when cancelled).
    meter_info: which memory meter yard reads, when it reads one.
    apps: app name -> its limits (``models``, ``max_queued``,
        ``max_concurrent``, ``weight``), shown with its counts.
    session_ttl_s: how long a dashboard login lasts.
    login_max_bytes: largest login form body.
    failures_before_delay, failure_max_delay_s: how wrong admin keys are
        slowed down (:class:`yard.api.keys.LoginThrottle`).
    shared_throttle: the throttle to use instead of a new one: the one that
        every route of the running yard shares (``yard.app.web.Web.keys``).
    clock: monotonic seconds for sessions and the throttle (tests move it).
    placements: backend name -> the GPUs it may be placed on (the timeline
        puts work ahead for a backend not loaded lately there).
    history: what the backends did lately, fed by ``engine.watch`` when the
        engine has it (the timeline).
    node: this yard's name in its cluster (``[cluster] node``), or None for a
        yard on its own; ``/metrics`` labels yard's series with it.
    cluster: the cluster as this node sees it (``Node.health``: the database
        and every node), or None; the status document's ``cluster``.
    http: what the HTTP server's connection limits did
        (``Server.statistics``; None before it serves), for ``/metrics``.
    """

    KEY: ClassVar[str] = "yard.observe"

    engine: EngineSource
    admin_key: str | None = None
    models: Mapping[str, Sequence[str]] = field(default_factory=dict)
    profile_margin: float = 1.0
    started_at: float = 0.0
    profiles: ProfileForgetter | None = None
    shutdown: trio.Event | None = None
    meter_info: MeterInfo | None = None
    apps: Mapping[str, Json] = field(default_factory=dict)
    session_ttl_s: float = 12 * 3600.0
    login_max_bytes: int = 4096
    failures_before_delay: int = 5
    failure_max_delay_s: float = 300.0
    clock: Callable[[], float] = trio.current_time
    placements: Mapping[str, Sequence[str]] = field(default_factory=dict)
    history: timeline.History = field(default_factory=timeline.History)
    node: str | None = None
    cluster: Callable[[], Json] | None = None
    http: Callable[[], ServerStatistics | None] | None = None
    registry: CollectorRegistry = field(init=False)
    decision_metrics: DecisionMetrics = field(init=False)
    sessions: auth.Sessions = field(init=False)
    shared_throttle: LoginThrottle | None = None
    throttle: LoginThrottle = field(init=False)
    _seeded: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        watch = getattr(self.engine, "watch", None)
        if callable(watch):
            watch(self.history.see)
        self.registry, self.decision_metrics = new_registry(
            self.engine, profile_margin=self.profile_margin, meter=self.meter, http=self.http
        )
        if self.node is not None:
            self.registry.register(NodeCollector(self.node, self.cluster))
        self.sessions = auth.Sessions(ttl_s=self.session_ttl_s)
        self.throttle = (
            LoginThrottle(
                failures_before_delay=self.failures_before_delay,
                max_delay_s=self.failure_max_delay_s,
            )
            if self.shared_throttle is None
            else self.shared_throttle
        )

    def use_config(self, config: Config) -> None:
        """Show the backends, models and apps of ``config`` from now on
        (``yard reload``, the models folder's rescans)."""
        self.models = {name: tuple(b.models) for name, b in config.backends.items()}
        self.placements = {name: tuple(b.gpus) for name, b in config.backends.items()}
        self.apps = _apps_json(config)

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        engine: EngineSource,
        started_at: float = 0.0,
        profiles: ProfileForgetter | None = None,
        shutdown: trio.Event | None = None,
        meter_info: MeterInfo | None = None,
        node: str | None = None,
        cluster: Callable[[], Json] | None = None,
        http: Callable[[], ServerStatistics | None] | None = None,
        shared_throttle: LoginThrottle | None = None,
    ) -> Observer:
        """The observer of a yard run with ``config`` (the other arguments are
        the fields of the same names)."""
        observer = cls(
            engine=engine,
            admin_key=config.server.admin_key,
            profile_margin=config.scheduler.profile_margin,
            started_at=started_at,
            profiles=profiles,
            shutdown=shutdown,
            meter_info=meter_info,
            session_ttl_s=config.server.dashboard_session_ttl_s,
            login_max_bytes=config.server.dashboard_login_max_bytes,
            failures_before_delay=config.server.admin_failures_before_delay,
            failure_max_delay_s=config.server.admin_failure_max_delay_s,
            shared_throttle=shared_throttle,
            node=node,
            cluster=cluster,
            http=http,
        )
        # What a reload changes is read from ``config`` in one place.
        observer.use_config(config)
        return observer

    def stopping(self) -> bool:
        """Whether yard is shutting down (streams should end)."""
        return self.shutdown is not None and self.shutdown.is_set()

    def meter(self) -> dict[str, str] | None:
        """Which memory meter yard uses: ``mode`` and ``detail``, or None
        without one."""
        if self.meter_info is None:
            return None
        return {"mode": self.meter_info.mode, "detail": self.meter_info.detail}

    def status(self, *, queue_limit: int = 200) -> Json:
        """The status document (see :func:`yard.observe.report.build_status`),
        with ``meter`` (:meth:`meter`) when yard has one."""
        document = build_status(
            self.engine,
            models=self.models,
            profile_margin=self.profile_margin,
            started_at=self.started_at,
            queue_limit=queue_limit,
        )
        meter = self.meter()
        if meter is not None:
            document["meter"] = meter
        document["apps"] = apps_json(self.apps, document["statistics"])
        if self.cluster is not None:
            document["cluster"] = self.cluster()
        return document

    def timeline(self, *, wall_now: float | None = None) -> Json:
        """The timeline document (:func:`yard.observe.timeline.build`): the
        last hour per device and backend, and the work ahead."""
        snapshot = self.engine.snapshot(limit=0)
        if not self._seeded:
            # Backends started before this observer was attached.
            self._seeded = True
            self.history.seed(snapshot, self.engine.decisions())
        return timeline.build(
            self.history,
            snapshot,
            models=self.models,
            placements=self.placements,
            wall_now=wall_now,
        )

    def timeline_svg(self) -> str:
        """The timeline as an SVG picture, for the dashboard."""
        return render_svg(self.timeline())

    def refusal(self) -> Rejected | None:
        """Why the current request may not act as the admin (None: it may).

        A wrong bearer key counts as a failed login of the client's address;
        while that address must wait, a bearer key is not even checked (429).
        """
        now = self.clock()
        client = request.remote_addr
        authorization = request.headers.get("Authorization")
        guessing = self.admin_key is not None and bearer_key(authorization) is not None
        if guessing:
            wait = self.throttle.wait_s(client, now)
            if wait > 0:
                return auth.too_many_failures(wait)
        refusal = auth.check_admin(
            admin_key=self.admin_key,
            method=request.method,
            remote_addr=client,
            authorization=authorization,
            session=self.sessions.is_live(request.cookies.get(auth.COOKIE), now),
            csrf_header=request.headers.get(auth.CSRF_HEADER),
        )
        if guessing:
            if refusal is None:
                self.throttle.succeeded(client)
            elif refusal.code == "invalid_admin_key":
                wait = self.throttle.failed(client, now)
                if wait > 0:
                    return Rejected(
                        refusal.status, refusal.code, refusal.message, retry_after_s=wait
                    )
        return refusal


def current_observer() -> Observer:
    """The observer of the app serving the current request."""
    observer = current_app.extensions[Observer.KEY]
    assert isinstance(observer, Observer)
    return observer


def _apps_json(config: Config) -> dict[str, Json]:
    """Each app's limits as the status document shows them."""
    return {
        name: {
            "models": None if app.models is None else list(app.models),
            "max_queued": app.max_queued,
            "max_concurrent": app.max_concurrent,
            "weight": app.weight,
        }
        for name, app in config.apps.items()
    }

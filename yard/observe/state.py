"""The observability side of one running yard: what the views share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import trio
from prometheus_client import CollectorRegistry
from quart import current_app, request

from yard.observe import auth
from yard.observe.metrics import DecisionMetrics, new_registry
from yard.observe.report import EngineSource, Json, build_status

if TYPE_CHECKING:
    from yard.http.runtime import Runtime


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
    extras: the runtime's extras; a ``trio.Event`` under ``"stopping"`` set
        when yard begins to shut down ends the endless streams (dashboard
        events, log tails) at once instead of holding the shutdown's grace.
    """

    KEY: ClassVar[str] = "yard.observe"

    engine: EngineSource
    admin_key: str | None = None
    models: Mapping[str, Sequence[str]] = field(default_factory=dict)
    profile_margin: float = 1.0
    started_at: float = 0.0
    profiles: ProfileForgetter | None = None
    extras: Mapping[str, object] = field(default_factory=dict)
    registry: CollectorRegistry = field(init=False)
    decision_metrics: DecisionMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.registry, self.decision_metrics = new_registry(
            self.engine, profile_margin=self.profile_margin, meter=self.meter
        )

    @classmethod
    def from_runtime(cls, runtime: Runtime) -> Observer:
        """The observer for a gateway's runtime. The profile store is taken
        from ``runtime.extras["profiles"]`` when the gateway put it there."""
        config = runtime.config
        profiles: Any = runtime.extras.get("profiles")
        return cls(
            engine=runtime.engine,
            admin_key=config.server.admin_key,
            models={name: tuple(b.models) for name, b in config.backends.items()},
            profile_margin=config.scheduler.profile_margin,
            started_at=runtime.started_at,
            profiles=profiles,
            extras=runtime.extras,
        )

    def stopping(self) -> bool:
        """Whether yard is shutting down (streams should end)."""
        event = self.extras.get("stopping")
        return isinstance(event, trio.Event) and event.is_set()

    def meter(self) -> dict[str, str] | None:
        """Which memory meter yard uses: ``mode`` and ``detail`` (the
        runtime's ``meter`` and ``meter_mode`` extras), or None without one."""
        detail = self.extras.get("meter_mode")
        if not isinstance(detail, str):
            return None
        mode = self.extras.get("meter")
        return {"mode": mode if isinstance(mode, str) else "", "detail": detail}

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
        return document

    def refusal(self) -> auth.Refusal | None:
        """Why the current request may not act as the admin (None: it may)."""
        return auth.check_admin(
            admin_key=self.admin_key,
            method=request.method,
            remote_addr=request.remote_addr,
            authorization=request.headers.get("Authorization"),
            cookie=request.cookies.get(auth.COOKIE),
            csrf_header=request.headers.get(auth.CSRF_HEADER),
        )


def current_observer() -> Observer:
    """The observer of the app serving the current request."""
    observer = current_app.extensions[Observer.KEY]
    assert isinstance(observer, Observer)
    return observer

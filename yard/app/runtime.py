"""What every HTTP part of yard is handed: the running gateway's parts.

``yard serve`` builds one :class:`Runtime` and gives it to the app factory
(:func:`yard.app.web.create_app`); Quart blueprints (jobs, dashboard, admin,
metrics) read it with :func:`current_runtime` inside a request, or keep the one
they were given by ``register(app, runtime)``.

Jobs plug into the proxy through :class:`JobService`: a request sent with
``Prefer: respond-async`` is parsed and checked by the proxy exactly like a
synchronous one, then handed over as a :class:`~yard.h1.upstream.ProxyRequest`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import trio

from yard.api.keys import KeyCheck

if TYPE_CHECKING:
    from yard.announce.service import Announcements
    from yard.batches.service import Batches
    from yard.cluster.node import Node
    from yard.config import Config
    from yard.engine import Engine
    from yard.h1.server import ServerStatistics
    from yard.h1.upstream import ProxyRequest, UpstreamPool
    from yard.ports import ProfileStore
    from yard.supervisor import Supervisor

RUNTIME_KEY = "yard.runtime"
"""Where the runtime sits in ``app.extensions`` (and ``app.config``)."""


class RequestHook(Protocol):
    """What the gateway calls once per proxied request as it ends
    (``yard.observe.observe_request``, left in ``runtime.observe_request``).

    outcome: ``ok``, ``error`` (the response was cut), ``cancelled`` (the
        client left, or yard is stopping), or the code it was rejected with.
    queued_s: arrival to dispatch; None when it was never dispatched.
    latency_s: dispatch to the end of the response; None unless proxied.
    """

    def __call__(
        self,
        *,
        model: str,
        backend: str,
        outcome: str,
        queued_s: float | None,
        latency_s: float | None,
    ) -> None: ...


class JobService(Protocol):
    """The async-job side of yard, as the proxy sees it."""

    async def submit(self, request: ProxyRequest, *, rerun_safe: bool) -> dict[str, object]:
        """Record ``request`` as a job and return its JSON (it has an ``"id"``).

        ``rerun_safe``: the client said the request may run again after a
        restart interrupted it (``Prefer: respond-async, rerun-safe``).
        Raises ``yard.engine.Rejected`` when the job cannot be accepted; the
        proxy answers with that error.
        """
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class MeterInfo:
    """Which memory meter yard reads, for the parts that show it.

    mode: ``nvml``, ``drm``, ``nvml+drm``, ``apple`` or ``host-only``.
    detail: the meter's sentence (which GPUs, through what; or why host-only).
    """

    mode: str
    detail: str


@dataclass(kw_only=True)
class Runtime:
    """The parts of one running yard.

    config: the loaded configuration.
    engine: the scheduler loop (``yard.engine.Engine``).
    launcher: the supervisor that starts backends (its processes and logs),
        or None where nothing real is launched (tests).
    jobs: the job service, or None when jobs are not available (the proxy
        then answers ``Prefer: respond-async`` with 501).
    batches: the Batch API's service (``/v1/files``, ``/v1/batches``), or None.
    announcements: the announcement service (``/v1/announcements``), or None.
    started_at: wall-clock time (``time.time()``) yard started serving.
    upstream: the connection pool every call to a backend goes through.
    urls: where the HTTP server listens, once it does (``["http://127.0.0.1:8080"]``).
    stopping: set when yard begins to shut down; endless streams (dashboard
        events, log tails) end then instead of holding the shutdown's grace.
    http_done: set once the HTTP server has stopped (its grace is over).
    profiles: the profile store (``DELETE /admin/profiles/NAME``), if any.
    meter: which memory meter yard reads (status, ``/metrics``), if any.
    observe_request: the metrics hook the gateway calls for each proxied
        request (left here by ``yard.observe.register``), if any.
    cluster: this node of a cluster (``[cluster]``; :mod:`yard.cluster.node`),
        or None for a yard on its own.
    http_statistics: what the HTTP server's connection limits have done
        (``Server.statistics``), once it serves; ``/metrics`` shows it.
    keys: the one key check (and wrong-key throttle) of every route that
        apps and the admin share, the dashboard's login included.
    """

    config: Config
    engine: Engine
    launcher: Supervisor | None = None
    jobs: JobService | None = None
    batches: Batches | None = None
    announcements: Announcements | None = None
    started_at: float = 0.0
    upstream: UpstreamPool = field(default_factory=lambda: _default_pool())
    urls: list[str] = field(default_factory=list)
    stopping: trio.Event = field(default_factory=trio.Event)
    http_done: trio.Event = field(default_factory=trio.Event)
    profiles: ProfileStore | None = None
    meter: MeterInfo | None = None
    observe_request: RequestHook | None = None
    cluster: Node | None = None
    http_statistics: Callable[[], ServerStatistics] | None = None
    keys: KeyCheck = field(init=False)

    def __post_init__(self) -> None:
        self.keys = KeyCheck(self.config)


def _default_pool() -> UpstreamPool:
    from yard.h1.upstream import UpstreamPool

    return UpstreamPool()


def current_runtime() -> Runtime:
    """The runtime of the app serving the current Quart request."""
    from quart import current_app

    runtime = current_app.extensions[RUNTIME_KEY]
    assert isinstance(runtime, Runtime)
    return runtime

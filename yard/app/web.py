"""The whole ASGI app: the data plane in front of the Quart control plane.

:func:`create_app` builds both from the :class:`Parts` of one yard and
returns the browser guard (:mod:`yard.http.guard`) around the
:class:`~yard.http.gateway.Gateway`, which answers ``/v1/*`` (but the jobs,
Batch and announcement APIs) and ``/backends/*`` itself and hands everything
else, lifespan included, to Quart: ``/healthz``, the jobs, Batch and
announcement APIs, each registered with the service it serves, the OpenAPI
document, and the dashboard, ``/metrics`` and the admin API
(:mod:`yard.observe`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import trio
from quart import Quart, Response
from quart_trio import QuartTrio

from yard.announce.metrics import AnnouncementCollector
from yard.api import announcements as announce_api
from yard.api import batches as batch_api
from yard.api import jobs as jobs_api
from yard.api.keys import KeyCheck
from yard.app import openapi
from yard.config import Config, ServerConfig
from yard.db import DatabaseError, passing
from yard.engine import Engine
from yard.h1 import server
from yard.h1.asgi import ASGIApp
from yard.h1.errors import error_body
from yard.h1.upstream import UpstreamPool
from yard.http.gateway import Gateway
from yard.http.guard import Guard, guard
from yard.http.ports import JobService
from yard.jobs.service import Jobs
from yard.observe import MeterInfo, Observer, install, observe_request

if TYPE_CHECKING:
    from yard.announce.service import Announcements
    from yard.batches.service import Batches
    from yard.cluster.node import Node
    from yard.h1.server import ServerStatistics
    from yard.ports import ProfileStore
    from yard.supervisor import Supervisor

log = logging.getLogger("yard.http")


def _no_statistics() -> ServerStatistics | None:
    return None


@dataclass(frozen=True, kw_only=True)
class Parts:
    """The parts of one yard that its HTTP side serves, every one built before
    this record is (:mod:`yard.app.serve` builds them in order; tests build
    the few they need).

    config: the loaded configuration.
    engine: the scheduler loop.
    pool: the upstream connections every call to a backend goes through.
    launcher: the supervisor that starts backends (its processes and logs),
        or None where nothing real is launched (tests).
    jobs: the job service, or None (``Prefer: respond-async`` and the jobs
        API then answer 501).
    batches: the Batch API's service (``/v1/files``, ``/v1/batches``), or None.
    announcements: the announcement service (``/v1/announcements``), or None.
    started_at: wall-clock time (``time.time()``) yard started serving.
    stopping: set when yard begins to shut down; endless streams (dashboard
        events, log tails) end then instead of holding the shutdown's grace.
    profiles: the profile store (``DELETE /admin/profiles/NAME``), if any.
    meter: which memory meter yard reads (status, ``/metrics``), if any.
    cluster: this node of a cluster (``[cluster]``; :mod:`yard.cluster.node`),
        or None for a yard on its own.
    http_statistics: what the HTTP server's connection limits have done
        (``Server.statistics``; None until it serves); ``/metrics`` shows it.
    """

    config: Config
    engine: Engine
    pool: UpstreamPool = field(default_factory=UpstreamPool)
    launcher: Supervisor | None = None
    jobs: JobService | None = None
    batches: Batches | None = None
    announcements: Announcements | None = None
    started_at: float = 0.0
    stopping: trio.Event = field(default_factory=trio.Event)
    profiles: ProfileStore | None = None
    meter: MeterInfo | None = None
    cluster: Node | None = None
    http_statistics: Callable[[], ServerStatistics | None] = _no_statistics


def create_control_app(parts: Parts, keys: KeyCheck | None = None) -> Quart:
    """The Quart app for everything but the data plane. ``keys``: the key
    check (and wrong-key throttle) every route shares (a new one if None)."""
    config = parts.config
    keys = KeyCheck(config) if keys is None else keys
    # No app-wide /static route: the dashboard serves its own files at /dashboard/static.
    app = QuartTrio("yard", static_folder=None)
    # Long answers (job results, event streams) must not be cut by Quart.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = config.server.max_body_bytes

    @app.get("/healthz")
    async def healthz() -> tuple[dict[str, object], int]:
        return {"status": "ok"}, 200

    @app.errorhandler(404)
    async def not_found(error: Exception) -> tuple[bytes, int, dict[str, str]]:
        body = error_body(404, "not_found", "no such path in yard")
        return body, 404, {"content-type": "application/json"}

    @app.errorhandler(405)
    async def not_allowed(error: Exception) -> tuple[bytes, int, dict[str, str]]:
        body = error_body(405, "method_not_allowed", "this method is not allowed here")
        return body, 405, {"content-type": "application/json"}

    @app.errorhandler(DatabaseError)
    async def database_error(error: DatabaseError) -> tuple[bytes, int, dict[str, str]]:
        # A cluster's database lost or busy: JSON that says when to try
        # again, never a 500 page (issue 26).
        if not passing(error):
            raise error
        body = error_body(503, "database_unavailable", f"{error}; try again shortly")
        return body, 503, {"content-type": "application/json", "retry-after": "2"}

    @app.after_request
    async def no_blind_retries(response: Response) -> Response:
        # Every error of the control plane says whether trying again helps
        # (yard.h1.errors: the OpenAI clients retry 409, 429 and 5xx unless told).
        if response.status_code >= 400 and not (
            "retry-after" in response.headers or "x-should-retry" in response.headers
        ):
            response.headers["x-should-retry"] = "false"
        return response

    openapi.register(app)  # GET /openapi.json: this API, as an OpenAPI 3.1 document
    # A stand-in job service (tests) serves the proxy, not the jobs API.
    jobs = parts.jobs if isinstance(parts.jobs, Jobs) else None
    jobs_api.register(app, jobs, keys)
    batch_api.register(app, parts.batches, keys)
    announce_api.register(app, parts.announcements, keys)
    cluster = parts.cluster
    observer = install(
        app,
        Observer.from_config(
            config,
            engine=parts.engine,
            started_at=parts.started_at,
            profiles=parts.profiles,
            shutdown=parts.stopping,
            meter_info=parts.meter,
            node=None if cluster is None else cluster.name,
            cluster=None if cluster is None else cluster.health,
            http=parts.http_statistics,
            shared_throttle=keys.throttle,
        ),
    )
    observer.registry.register(AnnouncementCollector(parts.announcements))
    return app


class Web:
    """The HTTP side of one yard, built from its :class:`Parts`.

    app: the ASGI app ``yard serve`` runs: the browser guard
    (:mod:`yard.http.guard`), then the data plane, then Quart.
    keys: the one key check (and wrong-key throttle) of every route that apps
    and the admin share, the dashboard's login included.
    """

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.keys = KeyCheck(parts.config)
        quart = create_control_app(parts, self.keys)
        self.observer: Observer | None = quart.extensions.get(Observer.KEY)
        control = cast(ASGIApp, quart)
        cluster = parts.cluster
        self.gateway = Gateway(
            control,
            config=parts.config,
            engine=parts.engine,
            pool=parts.pool,
            started_at=parts.started_at,
            jobs=parts.jobs,
            observe=observe_request,
            router=None if cluster is None else cluster.forwarder,
            health=None if cluster is None else cluster.health,
        )
        self.app = guard(self.gateway, parts.config)

    def use_config(self, config: Config) -> None:
        """Serve with ``config`` from the next request on (``yard reload``):
        app keys, scopes and model names change at once. What needs a restart
        (``[server]`` listen and limits, the dashboard's settings) keeps the
        value yard started with."""
        self.keys.use_config(config)
        self.gateway.use_config(config)
        if self.observer is not None:
            self.observer.use_config(config)  # the dashboard's and yard models' names


def create_app(parts: Parts) -> Guard:
    """The ASGI app ``yard serve`` runs for ``parts`` (:attr:`Web.app`)."""
    return Web(parts).app


async def serve_app(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    graceful_s: float = 10.0,
    listeners: list[trio.SocketListener] | None = None,
    server_config: ServerConfig | None = None,
    on_server: Callable[[server.Server], None] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` (or on ``listeners`` already bound with
    :func:`yard.h1.server.open_listeners`) with yard's lean HTTP/1.1 server.
    ``server_config``: the ``[server]`` table whose connection limits and
    admin key apply (:class:`yard.h1.server.Limits`' defaults if None).

    Reports the bound addresses (``["http://127.0.0.1:8080"]``; port 0 picks a
    free one) through ``task_status`` once the socket listens. When
    ``shutdown_trigger`` returns, stops accepting and gives in-flight requests
    ``graceful_s`` seconds before they are cancelled. No response timeout
    applies: a stream lasts as long as its backend sends. ``on_server`` is
    handed the :class:`~yard.h1.server.Server` before it accepts (its
    ``statistics()`` feed ``/metrics``).
    """
    await server.serve(
        app,
        host,
        port,
        shutdown_trigger=shutdown_trigger,
        graceful_s=graceful_s,
        limits=server.Limits.from_config(server_config) if server_config else None,
        admin_key=server_config.admin_key if server_config else None,
        listeners=listeners,
        on_server=on_server,
        task_status=task_status,
    )

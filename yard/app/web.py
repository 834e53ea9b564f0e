"""The whole ASGI app: the data plane in front of the Quart control plane.

:func:`create_app` builds both and returns the :class:`~yard.http.gateway.Gateway`,
which answers ``/v1/*`` (but ``/v1/jobs``) and ``/backends/*`` itself and hands
everything else, lifespan included, to Quart: ``/healthz``, the jobs API
(``yard.jobs.api.blueprint`` at ``/v1/jobs``) and what
``yard.observe.register(app, runtime)`` adds (dashboard, metrics, admin).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import cast

import trio
from quart import Quart, Response
from quart_trio import QuartTrio

from yard.announce import api as announce_api
from yard.announce.metrics import AnnouncementCollector
from yard.app import openapi
from yard.app.runtime import RUNTIME_KEY, Runtime
from yard.batches import api as batch_api
from yard.config import ServerConfig
from yard.h1 import server
from yard.h1.asgi import ASGIApp
from yard.h1.errors import error_body
from yard.http.gateway import Gateway
from yard.http.guard import Guard, guard
from yard.jobs.api import blueprint as jobs_blueprint
from yard.observe import register as register_observe

log = logging.getLogger("yard.http")


def create_control_app(runtime: Runtime) -> Quart:
    """The Quart app for everything but the data plane."""
    # No app-wide /static route: the dashboard serves its own files at /dashboard/static.
    app = QuartTrio("yard", static_folder=None)
    app.extensions[RUNTIME_KEY] = runtime
    app.config["YARD_RUNTIME"] = runtime
    # Long answers (job results, event streams) must not be cut by Quart.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = runtime.config.server.max_body_bytes

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
    app.register_blueprint(jobs_blueprint, url_prefix="/v1/jobs")
    app.register_blueprint(batch_api.files, url_prefix="/v1/files")
    app.register_blueprint(batch_api.batches, url_prefix="/v1/batches")
    app.register_blueprint(announce_api.blueprint, url_prefix="/v1/announcements")
    observer = register_observe(app, runtime)
    observer.registry.register(AnnouncementCollector(runtime))
    return app


def create_app(runtime: Runtime) -> Guard:
    """The ASGI app ``yard serve`` runs: the browser guard
    (:mod:`yard.http.guard`), then the data plane, then Quart."""
    control = cast(ASGIApp, create_control_app(runtime))
    return guard(Gateway(runtime, control), runtime.config)


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

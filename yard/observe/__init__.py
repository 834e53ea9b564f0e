"""See what the bouncer sees: the dashboard, ``/metrics`` and the admin API.

``register(app, runtime)`` mounts all three on the gateway's Quart app:

- ``/dashboard``: a live page (server-rendered, updated over server-sent
  events by a small script shipped with the package; no build step, no CDN).
- ``/metrics``: Prometheus text format (:mod:`yard.observe.metrics`).
- ``/admin/...``: status JSON, load / unload / pin / unpin, a backend's log
  tail, forgetting a profile (:mod:`yard.observe.admin`).

Layout: ``report`` builds the one status document every view shows; ``auth``
decides who is the admin; ``dashboard``, ``admin`` and ``metrics`` serve it.
The gateway reports each finished request through :func:`observe_request`
(or only its latency through :func:`observe_proxy_latency`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from yard.observe.metrics import observe_proxy_latency, observe_request
from yard.observe.state import Observer

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from yard.app.runtime import Runtime

__all__ = ["Observer", "install", "observe_proxy_latency", "observe_request", "register"]


def register(app: QuartTrio, runtime: Runtime) -> Observer:
    """Mount the dashboard, ``/metrics`` and the admin API on ``app``, serving
    the runtime's engine and configuration.

    Returns the :class:`Observer` that serves them (also kept in
    ``app.extensions["yard.observe"]``). The gateway's hook is left in
    ``runtime.observe_request`` (:func:`observe_request`), so that
    the proxy can report each request without importing this package.
    """
    runtime.observe_request = observe_request
    return install(app, Observer.from_runtime(runtime))


def install(app: QuartTrio, observer: Observer) -> Observer:
    """Mount the dashboard, ``/metrics`` and the admin API on ``app``, serving
    ``observer`` (for callers that build one themselves, such as tests)."""
    from yard.observe.admin import blueprint as admin_blueprint
    from yard.observe.dashboard import blueprint as dashboard_blueprint
    from yard.observe.metrics_view import blueprint as metrics_blueprint

    app.extensions[Observer.KEY] = observer
    app.register_blueprint(dashboard_blueprint)
    app.register_blueprint(admin_blueprint)
    app.register_blueprint(metrics_blueprint)
    return observer

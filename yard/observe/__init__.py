"""See what the bouncer sees: the dashboard, ``/metrics`` and the admin API.

:func:`install` mounts all three on the gateway's Quart app, serving an
:class:`Observer` (``Observer.from_config``):

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
from yard.observe.state import MeterInfo, Observer

if TYPE_CHECKING:
    from quart_trio import QuartTrio

__all__ = ["MeterInfo", "Observer", "install", "observe_proxy_latency", "observe_request"]


def install(app: QuartTrio, observer: Observer) -> Observer:
    """Mount the dashboard, ``/metrics`` and the admin API on ``app``, serving
    ``observer`` (kept in ``app.extensions["yard.observe"]``; returned)."""
    from yard.observe.admin import blueprint as admin_blueprint
    from yard.observe.dashboard import blueprint as dashboard_blueprint
    from yard.observe.metrics_view import blueprint as metrics_blueprint

    app.extensions[Observer.KEY] = observer
    app.register_blueprint(dashboard_blueprint)
    app.register_blueprint(admin_blueprint)
    app.register_blueprint(metrics_blueprint)
    return observer

"""The ``/metrics`` route. Open to every client that can reach yard, as
Prometheus expects (it carries no request contents, only counts and sizes)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from quart import Blueprint, Response

from yard.observe.cluster import NodeLabelled
from yard.observe.state import current_observer

blueprint = Blueprint("yard_metrics", __name__)


@blueprint.get("/metrics")
async def metrics() -> Response:
    """Everything in the Prometheus text format (0.0.4)."""
    observer = current_observer()
    observer.decision_metrics.catch_up(observer.engine)
    # A cluster node labels every series with its name (yard.observe.cluster).
    registry = (
        observer.registry
        if observer.node is None
        else NodeLabelled(observer.registry, observer.node)
    )
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)

"""``yard_announcements_total{app,outcome}``: announcements that ended, by how."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from yard.announce.service import Announcements

if TYPE_CHECKING:
    from yard.app.runtime import Runtime


class AnnouncementCollector(Collector):
    """Reads the runtime's announcement service when Prometheus scrapes."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "yard_announcements",
            "Announcements that ended since yard started, by app and outcome "
            "(used: their requests came; expired: their window closed first; withdrawn).",
            labels=["app", "outcome"],
        )
        service = self._runtime.announcements
        if isinstance(service, Announcements):
            for (app, outcome), count in sorted(service.counts().items()):
                family.add_metric([app, outcome], count)
        yield family

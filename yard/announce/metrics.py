"""``yard_announcements_total{app,outcome}``: announcements that ended, by how."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from yard.announce.service import Announcements


class AnnouncementCollector(Collector):
    """Reads the announcement service's counts when Prometheus scrapes."""

    def __init__(self, service: Announcements | None) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "yard_announcements",
            "Announcements that ended since yard started, by app and outcome "
            "(used: their requests came; expired: their window closed first; withdrawn).",
            labels=["app", "outcome"],
        )
        if self._service is not None:
            for (app, outcome), count in sorted(self._service.counts().items()):
                family.add_metric([app, outcome], count)
        yield family

"""A cluster node in ``/metrics`` (issue 13).

On a node (``[cluster]``), every series yard exports carries a ``node`` label
with the node's name (:class:`NodeLabelled`, applied when ``/metrics`` is
rendered), so that one Prometheus scraping every node tells them apart
without relabelling rules. Beside them, :class:`NodeCollector` adds:

- ``yard_node_info{node}`` (always 1): this yard is a node of a cluster;
- ``yard_node_database_ok{node}``: 1 while it reaches the shared database;
- ``yard_cluster_node_up{node,peer}``: each node of the registry as this one
  sees it (1 up, 0 gone), ``yard_cluster_heartbeat_age_seconds{node,peer}``
  and ``yard_cluster_node_queue{node,peer,backend}`` (its jobs waiting there).

A yard on its own exports none of these and no ``node`` label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

Json = dict[str, Any]


class NodeCollector(Collector):
    """This node and the registry as it sees it (see the module's series)."""

    def __init__(self, node: str, cluster: Callable[[], Json] | None) -> None:
        self._node = node
        self._cluster = cluster

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "yard_node_info", "This yard is a node of a cluster (always 1).", labels=["node"]
        )
        info.add_metric([self._node], 1.0)
        yield info
        if self._cluster is None:
            return
        health = self._cluster()
        ok = GaugeMetricFamily(
            "yard_node_database_ok",
            "1 while this node reaches the cluster's shared database.",
            labels=["node"],
        )
        ok.add_metric([self._node], 1.0 if health.get("database") == "ok" else 0.0)
        yield ok
        up = GaugeMetricFamily(
            "yard_cluster_node_up",
            "Each node of the registry as this one sees it: 1 up, 0 gone.",
            labels=["node", "peer"],
        )
        age = GaugeMetricFamily(
            "yard_cluster_heartbeat_age_seconds",
            "Seconds since each node's last heartbeat, by this node's clock.",
            labels=["node", "peer"],
        )
        queue = GaugeMetricFamily(
            "yard_cluster_node_queue",
            "Requests waiting in each node's own queue, per backend.",
            labels=["node", "peer", "backend"],
        )
        for peer in health.get("nodes", []):
            name = str(peer["name"])
            up.add_metric([self._node, name], 1.0 if peer["state"] == "up" else 0.0)
            age.add_metric([self._node, name], float(peer["heartbeat_age_s"]))
            for backend, waiting in peer.get("queues", {}).items():
                queue.add_metric([self._node, name, str(backend)], float(waiting))
        yield up
        yield age
        yield queue


class NodeLabelled:
    """A registry whose every sample carries ``node="NAME"`` (samples that
    already have a ``node`` label keep theirs). Pass it to
    ``prometheus_client.generate_latest`` in place of the registry."""

    def __init__(self, registry: Collector, node: str) -> None:
        self._registry = registry
        self._node = node

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            labelled = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            labelled.samples = [self._label(sample) for sample in metric.samples]
            yield labelled

    def _label(self, sample: Sample) -> Sample:
        if "node" in sample.labels:
            return sample
        return sample._replace(labels={"node": self._node, **sample.labels})

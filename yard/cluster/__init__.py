"""Several yard nodes sharing one PostgreSQL database (issue 13).

The rooms of this package:

The stores are yard's own (:mod:`yard.jobs.store`, :mod:`yard.batches.store`,
:mod:`yard.memory.profiles`) over the database interface (:mod:`yard.db`);
a cluster injects its PostgreSQL and adds what only a cluster has:

- :mod:`yard.cluster.pg`: PostgreSQL from Trio (worker threads, a few
  connections) and versioned migrations under an advisory lock.
- :mod:`yard.cluster.schema`: the shared tables (jobs, nodes, profiles, batches).
- :mod:`yard.cluster.jobs`: :class:`ClusterJobStore`, the job store with one
  priority order (``rank``) and claims (``FOR UPDATE SKIP LOCKED``).
- :mod:`yard.cluster.registry`: what each node serves, has loaded and has free.
- :mod:`yard.cluster.listen`: ``LISTEN``/``NOTIFY`` wake-ups, without polling.
- :mod:`yard.cluster.profiles`: the key that shares a profile between nodes
  with the same GPU.
- :mod:`yard.cluster.batches`: :class:`ClusterBatchStore`, the batch store
  with one driving node per batch.
- :mod:`yard.cluster.node`, :mod:`yard.cluster.forward`: the node itself
  (claiming loop, heartbeats, forwarding synchronous requests).
"""

from __future__ import annotations

from yard.cluster.batches import ClusterBatchStore
from yard.cluster.jobs import ClusterJobStore, rank_of
from yard.cluster.listen import Listener, ListenerStatistics
from yard.cluster.pg import DatabaseLost, PgDatabase, PgLimits, PgMigration, PgStatistics
from yard.cluster.profiles import cluster_key
from yard.cluster.reaping import ReapSummary
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import ENDED_CHANNEL, JOBS_CHANNEL, MIGRATIONS, NODES_CHANNEL

__all__ = [
    "ENDED_CHANNEL",
    "JOBS_CHANNEL",
    "MIGRATIONS",
    "NODES_CHANNEL",
    "ClusterBatchStore",
    "ClusterJobStore",
    "DatabaseLost",
    "Listener",
    "ListenerStatistics",
    "NodeState",
    "PgDatabase",
    "PgLimits",
    "PgMigration",
    "PgStatistics",
    "ReapSummary",
    "Registry",
    "cluster_key",
    "rank_of",
]

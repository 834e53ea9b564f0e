"""Several yard nodes sharing one PostgreSQL database (issue 13).

The rooms of this package:

- :mod:`yard.cluster.pg`: PostgreSQL from Trio (worker threads, a few
  connections) and versioned migrations under an advisory lock.
- :mod:`yard.cluster.schema`: the shared tables (jobs, nodes, profiles, batches).
- :mod:`yard.cluster.jobs`: :class:`PgJobStore`, the job store of a cluster,
  with one priority order (``rank``) and claiming (``FOR UPDATE SKIP LOCKED``).
- :mod:`yard.cluster.registry`: what each node serves, has loaded and has free.
- :mod:`yard.cluster.listen`: ``LISTEN``/``NOTIFY`` wake-ups, without polling.
- :mod:`yard.cluster.profiles`: profiles shared by every node with the same GPU.
- :mod:`yard.cluster.batches`: :class:`PgBatchStore`, the Batch API's files,
  batches and lines, with one driving node per batch.
- :mod:`yard.cluster.node`, :mod:`yard.cluster.forward`: the node itself
  (claiming loop, heartbeats, forwarding synchronous requests).
"""

from __future__ import annotations

from yard.cluster.batches import PgBatchStore
from yard.cluster.jobs import PgJobStore, rank_of
from yard.cluster.listen import Listener, ListenerStatistics
from yard.cluster.pg import DatabaseLost, PgDatabase, PgLimits, PgMigration, PgStatistics
from yard.cluster.profiles import PgProfileStore, cluster_key
from yard.cluster.reaping import ReapSummary
from yard.cluster.registry import NodeState, Registry
from yard.cluster.schema import ENDED_CHANNEL, JOBS_CHANNEL, MIGRATIONS, NODES_CHANNEL

__all__ = [
    "ENDED_CHANNEL",
    "JOBS_CHANNEL",
    "MIGRATIONS",
    "NODES_CHANNEL",
    "DatabaseLost",
    "Listener",
    "ListenerStatistics",
    "NodeState",
    "PgBatchStore",
    "PgDatabase",
    "PgJobStore",
    "PgLimits",
    "PgMigration",
    "PgProfileStore",
    "PgStatistics",
    "ReapSummary",
    "Registry",
    "cluster_key",
    "rank_of",
]

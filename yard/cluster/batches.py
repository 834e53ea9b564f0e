"""The Batch API's batches in a cluster: one driving node per batch.

:class:`ClusterBatchStore` is the batch store
(:class:`yard.batches.store.BatchStore`, whose queries and rules it keeps) on
the cluster's PostgreSQL, where a line becomes a job of the shared queue that
any node may claim. What it adds: ``batches.driver`` names the node that
validates the batch, hands its lines in, records their outcomes and writes
its files. A node takes a batch (:meth:`ClusterBatchStore.adopt`) only if
nobody drives it, it drives it already, or its driver is not ``up`` in the
node registry (declared gone by a heartbeat check, or left). Two drivers at
once (a node declared gone while it was alive, until it notices) are safe,
only wasteful: every write of the batch store is conditional.
"""

from __future__ import annotations

import logging

from yard.batches.records import BatchRecord
from yard.batches.rows import UNENDED
from yard.batches.store import BatchStore
from yard.cluster.jobs import ClusterJobStore

__all__ = ["ClusterBatchStore"]

log = logging.getLogger("yard.batches")

_FREE = (
    "(driver IS NULL OR driver = ? OR NOT EXISTS "
    "(SELECT 1 FROM nodes WHERE nodes.name = batches.driver AND nodes.state = 'up'))"
)
"""A batch this node may drive: nobody's, its own, or a node's that is not up."""


class ClusterBatchStore(BatchStore):
    """Files, batches and lines of a cluster, as seen from one node (that of
    ``jobs``, whose claimable jobs the lines become)."""

    _UNDRIVEN = ", driver = NULL"
    jobs: ClusterJobStore

    def __init__(self, jobs: ClusterJobStore) -> None:
        super().__init__(jobs)
        self.node = jobs.node

    def _driven(self) -> dict[str, object]:
        return {"driver": self.node}

    async def unended(self) -> list[BatchRecord]:
        """The batches that have not ended and that this node may drive
        (see :meth:`adopt`), oldest first."""
        return await self._unended(f" AND {_FREE}", self.node)

    async def adopt(self, batch_id: str) -> bool:
        """Make this node the batch's driver, if it has not ended and nobody
        else alive drives it. True if this node drives it now."""
        changed = await self._db.execute(
            f"UPDATE batches SET driver = ? WHERE id = ? AND status IN {UNENDED} AND {_FREE}",
            (self.node, batch_id, self.node),
        )
        if changed == 1:
            log.info("batch %s: driven by node %s", batch_id, self.node)
        return changed == 1

    async def drives(self, batch_id: str) -> bool:
        """Whether this node is (still) the batch's driver."""
        row = await self._db.fetchone("SELECT driver FROM batches WHERE id = ?", (batch_id,))
        return row is not None and row[0] == self.node

    async def release(self) -> int:
        """Give up driving every batch this node drives (a graceful stop), so
        that another node takes them over at once. Returns how many."""
        return await self._db.execute(
            "UPDATE batches SET driver = NULL WHERE driver = ?", (self.node,)
        )

    async def cancelled_elsewhere(self, batch_id: str) -> bool:
        """Whether the batch has been cancelled (perhaps on another node), or
        is gone."""
        batch = await self.batch(batch_id)
        return batch is None or batch.status == "cancelling"

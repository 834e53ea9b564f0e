"""The registry: what each node of a cluster serves, has loaded and has free.

Rules this module keeps:

- Each node publishes its whole state every few seconds (an upsert of one
  row) and ``NOTIFY yard_nodes, name`` in the same transaction.
- A node is stale when its last heartbeat is older than ``after_s`` by the
  clock of the node that asks: heartbeats are wall-clock epochs, so the
  nodes' clocks must agree to well within ``after_s`` (NTP does).
- Declaring a node gone is a conditional update: of several nodes that find
  it stale at once, exactly one flips it. A dead node is declared gone and
  reaped in one transaction (:meth:`yard.cluster.jobs.ClusterJobStore.reap_gone`),
  so no node ever sees it gone while it still holds jobs;
  :meth:`Registry.mark_gone` is for a node leaving on its own (after it gave
  its jobs back). A node that publishes again is up again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from yard.cluster.pg import PgDatabase
from yard.cluster.schema import NODES_CHANNEL
from yard.db import Row, Tx, insert

__all__ = ["NodeState", "Registry"]

_COLUMNS = (
    "name, url, heartbeat_at, started_at, serves, backends, loaded, free_mib, queues, "
    "gpu_models, database_ok, state"
)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as it last published itself.

    name: unique in the cluster. url: where other nodes reach it.
    heartbeat_at, started_at: its wall clock (epoch seconds). serves: model
    names. backends: backend names. loaded: backends loaded now. free_mib:
    free memory per device (MiB). queues: jobs waiting in its own queue per
    backend. gpu_models: the GPUs it has (product names). database_ok: whether
    it reaches the database. state: ``"up"`` or ``"gone"`` (declared dead).
    """

    name: str
    url: str
    heartbeat_at: float
    started_at: float
    serves: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    loaded: tuple[str, ...] = ()
    free_mib: Mapping[str, float] = field(default_factory=dict)
    queues: Mapping[str, int] = field(default_factory=dict)
    gpu_models: tuple[str, ...] = ()
    database_ok: bool = True
    state: str = "up"


def _state(row: Row) -> NodeState:
    (name, url, heartbeat_at, started_at, serves, backends, loaded, free_mib, queues) = row[:9]
    gpu_models, database_ok, state = row[9:]
    return NodeState(
        name=str(name),
        url=str(url),
        heartbeat_at=float(heartbeat_at),
        started_at=float(started_at),
        serves=_strings(serves),
        backends=_strings(backends),
        loaded=_strings(loaded),
        free_mib={str(k): float(v) for k, v in _mapping(free_mib).items()},
        queues={str(k): int(v) for k, v in _mapping(queues).items()},
        gpu_models=_strings(gpu_models),
        database_ok=bool(database_ok),
        state=str(state),
    )


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in value) if isinstance(value, list) else ()


def _mapping(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


class Registry:
    """The ``nodes`` table of a cluster database (opened with
    :data:`yard.cluster.schema.MIGRATIONS`)."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def publish(self, state: NodeState) -> None:
        """Write ``state`` as this node's row (replacing the last one) and
        wake the listening nodes."""
        if state.state not in ("up", "gone"):
            raise ValueError(f"a node's state is 'up' or 'gone', not {state.state!r}")
        values = dict(
            zip(
                _COLUMNS.split(", "),
                (
                    state.name,
                    state.url,
                    state.heartbeat_at,
                    state.started_at,
                    Jsonb(list(state.serves)),
                    Jsonb(list(state.backends)),
                    Jsonb(list(state.loaded)),
                    Jsonb(dict(state.free_mib)),
                    Jsonb(dict(state.queues)),
                    Jsonb(list(state.gpu_models)),
                    state.database_ok,
                    state.state,
                ),
                strict=True,
            )
        )
        replace = ", ".join(f"{name} = excluded.{name}" for name in values if name != "name")

        def _publish(tx: Tx) -> None:
            # A heartbeat lost in a crash of the database is only an older
            # heartbeat: its commit need not wait for the disk.
            tx.execute("SET LOCAL synchronous_commit = off")
            insert(tx, "nodes", values, conflict=f"(name) DO UPDATE SET {replace}")
            tx.notify(NODES_CHANNEL, state.name)

        await self._db.transaction(_publish)

    async def nodes(self) -> list[NodeState]:
        """Every node ever registered (up and gone), by name."""
        rows = await self._db.fetchall(f"SELECT {_COLUMNS} FROM nodes ORDER BY name")
        return [_state(row) for row in rows]

    async def node(self, name: str) -> NodeState | None:
        row = await self._db.fetchone(f"SELECT {_COLUMNS} FROM nodes WHERE name = ?", (name,))
        return None if row is None else _state(row)

    async def stale(self, now: float, after_s: float) -> list[str]:
        """The nodes still up whose last heartbeat is older than
        ``now - after_s``, by name."""
        rows = await self._db.fetchall(
            "SELECT name FROM nodes WHERE state = 'up' AND heartbeat_at < ? ORDER BY name",
            (now - after_s,),
        )
        return [str(row[0]) for row in rows]

    async def mark_gone(self, name: str, *, heartbeat_before: float | None = None) -> bool:
        """Declare ``name`` gone. True only for the one caller that changed it
        from up. Only for a node leaving on its own, whose jobs are already
        back: a dead node is declared gone and reaped at once with
        :meth:`yard.cluster.jobs.ClusterJobStore.reap_gone`.

        heartbeat_before: only if its heartbeat is still older than this
        (it did not publish in between the check and now).
        """
        changed = await self._db.execute(
            "UPDATE nodes SET state = 'gone' WHERE name = ? AND state = 'up' "
            "AND (?::double precision IS NULL OR heartbeat_at < ?)",
            (name, heartbeat_before, heartbeat_before),
        )
        return changed == 1

    async def forget(self, name: str) -> bool:
        """Remove a gone node's row (it will not come back). False if it is
        up or unknown."""
        changed = await self._db.execute(
            "DELETE FROM nodes WHERE name = ? AND state = 'gone'", (name,)
        )
        return changed == 1

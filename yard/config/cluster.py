"""``[cluster]``: several yard nodes sharing one PostgreSQL (:class:`ClusterConfig`)
and its reader.

Without a ``[cluster]`` table ``Config.cluster`` is None and yard is one
machine on SQLite, as always. With it, the jobs, the profiles and the node
registry live in the PostgreSQL database named by ``database`` (or by the
environment variable ``database_env`` names, so that a password stays out of
the file), and this node takes part as ``node``.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from yard.config.reading import _non_negative, _positive, _Reader
from yard.config.server import ServerConfig

CLUSTER_KEYS = (
    "database",
    "database_env",
    "node",
    "url",
    "secret",
    "secret_env",
    "heartbeat_s",
    "dead_after_s",
    "claim_ahead",
    "connect_timeout_s",
    "idle_in_transaction_s",
    "lock_timeout_s",
    "statement_timeout_s",
)

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """``[cluster]``: this node's part in a cluster of yards.

    database: the PostgreSQL connection string (``postgresql://...`` or
        ``host=... dbname=...``), from ``database`` or ``database_env``.
    node: this node's name, unique in the cluster (default: the host name).
    url: where the other nodes reach this node's HTTP port
        (``http://HOST:PORT``); empty: from ``server.listen`` (see
        :meth:`node_url`).
    secret: shared by every node; a forwarded request carries it, and only
        then is its original arrival time (``X-Yard-Arrived-At``) believed.
        None: arrival times of forwarded requests are never believed (each
        node ages a forwarded request from when it got it).
    heartbeat_s: how often this node publishes its state to the registry (and
        looks for work and for dead nodes).
    dead_after_s: a node whose last heartbeat is older than this is taken as
        dead: its queued jobs go back to the shared queue at their old place,
        its running ones end ``interrupted``.
    claim_ahead: how many claimed jobs per backend may wait in this node's own
        queue beyond its free slots (0: none, so that no node holds a job
        another could start sooner; more hide the claim's round trip between
        one job's end and the next one's start).
    connect_timeout_s: longest wait to reach the database server.
    idle_in_transaction_s: the server ends a session of this node that sits
        in a transaction this long (a node whose host vanished must not keep
        its row locks until the server's keepalives give up).
    lock_timeout_s: a database call that waits longer for a lock fails
        instead of stalling the node.
    statement_timeout_s: the longest one database statement may run.
    """

    database: str
    node: str
    url: str = ""
    secret: str | None = None
    heartbeat_s: float = 2.0
    dead_after_s: float = 10.0
    claim_ahead: int = 0
    connect_timeout_s: float = 5.0
    idle_in_transaction_s: float = 15.0
    lock_timeout_s: float = 10.0
    statement_timeout_s: float = 60.0

    def node_url(self, server: ServerConfig) -> str:
        """Where the other nodes reach this one: ``url``, or else
        ``http://HOST:PORT`` of ``server.listen`` (this machine's host name
        when yard listens on every address)."""
        return self.url or default_url(server)


def default_node_name() -> str:
    """The short host name, as a node name (``gpubox`` of ``gpubox.lan``)."""
    name = socket.gethostname().split(".")[0] or "yard"
    return name if _NODE.match(name) else "yard"


def default_url(server: ServerConfig) -> str:
    """``http://HOST:PORT`` from the listen address; a wildcard address
    (``0.0.0.0``, ``::``) becomes this machine's host name."""
    host = server.listen_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{server.listen_port}"


def _cluster(r: _Reader, raw: object) -> ClusterConfig | None:
    """Read ``[cluster]`` (None when the file has none)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        r.error("cluster", "must be a table ([cluster])")
        return None
    data: dict[str, Any] = raw
    r.known(data, "cluster", CLUSTER_KEYS)
    database = r.secret(data, "cluster", "database", "database_env")
    if database is None and "database" not in data and "database_env" not in data:
        r.error(
            "cluster",
            "needs the PostgreSQL database the nodes share: database = "
            '"postgresql://USER@HOST/DB", or database_env = "YARD_DATABASE_URL" to read it '
            "from the environment",
        )
    elif database is not None and not _looks_like_dsn(database):
        where = "cluster.database" if "database" in data else "cluster.database_env"
        r.error(
            where,
            "is not a PostgreSQL connection string; expected postgresql://USER@HOST[:PORT]/DB "
            "or key=value pairs such as 'host=/run/postgresql dbname=yard'",
        )
    node = r.get(data, "cluster", "node", str, "", _node_name) or default_node_name()
    url = r.get(data, "cluster", "url", str, "", _url).rstrip("/")
    secret = r.secret(data, "cluster", "secret", "secret_env")
    heartbeat = r.get(data, "cluster", "heartbeat_s", float, 2.0, _positive)
    dead_after = r.get(data, "cluster", "dead_after_s", float, 10.0, _positive)
    if "dead_after_s" in data and dead_after < 2 * heartbeat:
        r.error(
            "cluster.dead_after_s",
            f"{dead_after:g} is less than two heartbeats (2 x heartbeat_s = {2 * heartbeat:g}); "
            "a node that is only slow once would be taken for dead. Raise it or lower "
            "heartbeat_s",
        )
        dead_after = max(10.0, 2 * heartbeat)
    elif "dead_after_s" not in data:
        dead_after = max(dead_after, 2 * heartbeat)
    claim_ahead = r.get(data, "cluster", "claim_ahead", int, 0, _non_negative)
    timeouts = {
        key: r.get(data, "cluster", key, float, default, _positive)
        for key, default in (
            ("connect_timeout_s", 5.0),
            ("idle_in_transaction_s", 15.0),
            ("lock_timeout_s", 10.0),
            ("statement_timeout_s", 60.0),
        )
    }
    return ClusterConfig(
        database=database or "",
        node=node,
        url=url,
        secret=secret,
        heartbeat_s=heartbeat,
        dead_after_s=dead_after,
        claim_ahead=claim_ahead,
        connect_timeout_s=timeouts["connect_timeout_s"],
        idle_in_transaction_s=timeouts["idle_in_transaction_s"],
        lock_timeout_s=timeouts["lock_timeout_s"],
        statement_timeout_s=timeouts["statement_timeout_s"],
    )


def _looks_like_dsn(text: str) -> bool:
    if text.startswith(("postgresql://", "postgres://")):
        return True
    return "=" in text and "://" not in text


def _node_name(value: str) -> str | None:
    if _NODE.match(value):
        return None
    return (
        f"{value!r} is not a node name: letters, digits, '_', '.', '-', starting with a "
        "letter or digit, at most 63 characters"
    )


def _url(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be http://HOST:PORT (where the other nodes reach this one), got {value!r}"
    if parts.path not in ("", "/") or parts.query:
        return f"must be the node's base URL without a path, got {value!r}"
    return None

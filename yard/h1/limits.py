"""What one client may hold of yard's HTTP/1.1 server: the ``[server]``
keys of the connection limits, as the server reads them."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Protocol

# File descriptors kept free of client connections: listeners, the event
# loop, SQLite, backend pipes and log files, NVML.
_FD_HEADROOM = 128


class Settings(Protocol):
    """Where the limits are read from: yard's ``[server]`` table
    (``yard.config.ServerConfig``), or anything with the same keys."""

    @property
    def keep_alive_s(self) -> float: ...
    @property
    def head_timeout_s(self) -> float: ...
    @property
    def body_timeout_s(self) -> float: ...
    @property
    def send_timeout_s(self) -> float: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def reserved_connections(self) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What one client may hold of the server; each is the ``[server]`` key
    of the same name.

    keep_alive_s: how long a connection may wait idle between requests.
    head_timeout_s: how long a request head may take, from the connection's
        start (first request) or from its first byte (later ones).
    body_timeout_s: how long a request body may go without a byte (408).
    send_timeout_s: how long a write may go without the client taking a
        byte; then the request ends as if the client had hung up.
    max_connections: open connections served in full; lowered to fit the
        open-file limit (:func:`connection_cap`).
    reserved_connections: connections beyond that kept for ``GET /healthz``
        and requests with the admin key.
    """

    keep_alive_s: float = 75.0
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    max_connections: int = 1000
    reserved_connections: int = 8

    @classmethod
    def from_config(cls, config: Settings) -> Limits:
        """The limits of a ``[server]`` table."""
        return cls(
            keep_alive_s=config.keep_alive_s,
            head_timeout_s=config.head_timeout_s,
            body_timeout_s=config.body_timeout_s,
            send_timeout_s=config.send_timeout_s,
            max_connections=config.max_connections,
            reserved_connections=config.reserved_connections,
        )


def connection_cap(configured: int, reserved: int) -> int:
    """``configured``, lowered so that every connection (served in full, or
    from the reserve) can also hold a backend connection within the soft
    ``RLIMIT_NOFILE``, with a headroom for yard's other files."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, (soft - _FD_HEADROOM) // 2 - reserved))

"""What the front door says and checks before the app sees a request.

Shared by a connection (:mod:`yard.h1.connection`), the lobby where new
connections wait for their first request (:mod:`yard.h1.lobby`) and the
server (:mod:`yard.h1.server`): the whole 503 that turns away a connection
over the cap, the 408 messages, the small body read before the app is
called, the admin key's bearer check, and the count of what the limits did.
"""

from __future__ import annotations

import hmac

from yard.h1.errors import error_body, error_headers
from yard.h1.limits import Limits

CLOSE = (b"connection", b"close")
"""The header that ends a connection after its answer."""

READ_BEFORE_APP = 64 * 1024
"""A body with a Content-Length up to this is read whole before the app is
called (see :meth:`yard.h1.connection.Connection._wait_small_body`)."""


def refusal(code: str, message: str, retry_after_s: float) -> bytes:
    """A whole ``503`` answer that closes the connection, as bytes."""
    body = error_body(503, code, message)
    fields = (*error_headers(body, retry_after_s), CLOSE)
    head = b"".join(b"%s: %s\r\n" % field for field in fields)
    return b"HTTP/1.1 503 Service Unavailable\r\n%s\r\n%s" % (head, body)


class Tally:
    """What the server's limits have done so far, counted (read through
    :meth:`yard.h1.server.Server.statistics`)."""

    __slots__ = (
        "body_timeouts",
        "evicted",
        "head_timeouts",
        "idle_closed",
        "refused",
        "send_timeouts",
    )

    def __init__(self) -> None:
        self.evicted = 0
        self.refused = 0
        self.head_timeouts = 0
        self.idle_closed = 0
        self.body_timeouts = 0
        self.send_timeouts = 0


def head_timeout_message(limits: Limits) -> str:
    """What a 408 for a request head that did not come in time says."""
    return (
        f"the request head did not arrive within {limits.head_timeout_s:g} s "
        "(server.head_timeout_s); send the whole head at once"
    )


def body_timeout_message(limits: Limits) -> str:
    """What a 408 for a small body that stopped coming says."""
    return (
        f"the request body made no progress for {limits.body_timeout_s:g}"
        " s (server.body_timeout_s); send the body without pauses"
    )


def small_content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body length if there is one and it is at most
    :data:`READ_BEFORE_APP` (the parser has checked the framing already)."""
    length = None
    for name, value in headers:
        if name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            return None
    if length is None or len(length) > 5 or not length.isdigit():
        return None
    size = int(length)
    return size if size <= READ_BEFORE_APP else None


def bearer_matches(headers: list[tuple[bytes, bytes]], key: bytes) -> bool:
    """Whether ``Authorization: Bearer KEY`` is among ``headers``."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, given = value.partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), key):
                return True
    return False

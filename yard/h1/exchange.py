"""One request and its response on a connection: the ASGI ``receive`` and
``send`` the app is given.

Extensions (in ``scope["extensions"]``):

- ``yard.hold``: a ``http.response.start`` message with ``"yard.hold": True``
  asks the server to hold the head back until the next body message (the
  sender promises one follows at once); without it the head is written at
  once, so streams show their headers without waiting for a first chunk.
- ``yard.disconnect``: an object with ``watch(cancel_scope)`` and
  ``unwatch()``: the server cancels the watched scope the moment the client
  goes away (or stops reading for ``send_timeout_s``), so the app needs no
  task of its own to watch for ``http.disconnect``.
"""

from __future__ import annotations

from typing import Protocol

import trio

from yard.h1 import wire
from yard.h1.asgi import Message

_CODES = {
    400: "malformed_request",
    431: "request_head_too_large",
    501: "unsupported_transfer_coding",
    505: "http_version_not_supported",
}


def protocol_failure(exc: wire.ProtocolError) -> tuple[int, str, str]:
    """The answer to a malformed request: status, code, message."""
    status = exc.status_hint
    return (
        status,
        _CODES.get(status, "malformed_request"),
        f"the request is not valid HTTP/1.1 ({exc}); fix the client's framing",
    )


_BodyEvent = wire.Event | wire.Signal


class Channel(Protocol):
    """What an exchange needs of its connection
    (:class:`yard.h1.connection.Connection`)."""

    wire: wire.ServerConnection
    gone: bool
    gone_event: trio.Event
    body_timeout_s: float

    async def write(self, data: bytes) -> None: ...

    async def body_event(self) -> _BodyEvent | None: ...

    def start_watching(self) -> None: ...

    def stop_watching(self) -> None: ...

    def hang_up(self) -> None: ...


class Exchange:
    """One request/response on a connection: the ASGI receive and send.

    ``failure``: set when the request body was malformed or stopped coming
    (status, code, message): the app was told ``http.disconnect``, and the
    connection answers with this error if the app did not answer.
    """

    __slots__ = ("body_done", "conn", "failure", "head_only", "held", "started")

    def __init__(self, conn: Channel, head_only: bool) -> None:
        self.conn = conn
        self.head_only = head_only
        self.body_done = False
        self.started = False
        self.held: bytes | None = None
        self.failure: tuple[int, str, str] | None = None

    async def receive(self) -> Message:
        conn = self.conn
        if not self.body_done:
            if conn.wire.they_are_waiting_for_100_continue:
                await conn.write(conn.wire.informational_100())
            try:
                event = await conn.body_event()
            except wire.ProtocolError as exc:
                self.body_done = True
                self.failure = protocol_failure(exc)
                return {"type": "http.disconnect"}
            if isinstance(event, wire.Data):
                return {"type": "http.request", "body": event.data, "more_body": True}
            self.body_done = True
            if isinstance(event, wire.EndOfMessage):
                conn.start_watching()
                return {"type": "http.request", "body": b"", "more_body": False}
            if event is None:
                self.failure = (
                    408,
                    "request_timeout",
                    f"the request body made no progress for {conn.body_timeout_s:g}"
                    " s (server.body_timeout_s); send the body without pauses",
                )
                return {"type": "http.disconnect"}
            conn.hang_up()
            return {"type": "http.disconnect"}
        # The body is in: the next message is the client going away.
        await conn.gone_event.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        conn = self.conn
        if conn.gone:
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            head = conn.wire.response_head(message["status"], list(message.get("headers", ())))
            if message.get("yard.hold"):
                self.held = head
            else:
                await conn.write(head)
        elif kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body before http.response.start")
            body = message.get("body", b"")
            out = self.held or b""
            self.held = None
            if body and not self.head_only:
                out += conn.wire.body(body)
            if not message.get("more_body", False):
                out += conn.wire.end()
                # Nothing is left to cancel: stop watching for a hang-up
                # before the last write rather than after it, when the
                # client may already be sending its next request.
                conn.stop_watching()
            await conn.write(out)
        else:
            raise RuntimeError(f"unsupported ASGI message {kind!r}")

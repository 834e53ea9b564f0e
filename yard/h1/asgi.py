"""The ASGI types yard's HTTP/1.1 server speaks (ASGI 3), and the one exception
an application may raise to it on purpose (:class:`ResponseCut`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ResponseCut(Exception):
    """An application ends a response it has started short of its length, on
    purpose: what it was sending is gone (a file deleted while downloaded). The
    server closes the connection, which HTTP clients report as an incomplete
    body, and logs the message as one warning, not as a failure of yard's."""

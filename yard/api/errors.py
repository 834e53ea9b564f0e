"""A refusal answered: the one place a :class:`yard.errors.Rejected` that a
service or a route raised becomes an HTTP answer of a Quart route, in the
OpenAI error shape with the retry headers of :mod:`yard.h1.errors`.

Services raise :class:`~yard.errors.Rejected` (or their own errors, which their
API maps); only the API layer turns them into HTTP (``docs/architecture.md``).
"""

from __future__ import annotations

from quart import Response
from werkzeug.datastructures import Headers

from yard.errors import Rejected
from yard.h1.errors import error_body, error_headers


def quoted(text: str) -> str:
    """``text`` quoted for an error message, cut to a readable length."""
    text = repr(text)
    return text if len(text) <= 80 else text[:77] + "..."


async def answer(error: Rejected) -> Response:
    """The answer to ``error`` (an error handler for ``Rejected``), with the
    request's field at fault (``param``) if it names one."""
    body = error_body(error.status, error.code, error.message, error.param)
    headers = [
        (n.decode("latin-1"), v.decode("latin-1"))
        for n, v in error_headers(body, error.retry_after_s)
        if n != b"content-length"
    ]
    return Response(body, status=error.status, headers=Headers(headers))

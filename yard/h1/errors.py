"""yard's own error answers, in the shape OpenAI clients already understand.

Every error yard itself produces (not a backend's) is JSON::

    {"error": {"message": "...", "type": "...", "code": "...", "param": null}}

``code`` is stable (``model_not_found``, ``deadline_missed``, ``does_not_fit``,
``backend_failed``, ``queue_full``, ...); ``message`` says what happened and
what to do. A backend's own 4xx/5xx is passed through untouched instead.

Retries. The official OpenAI clients (Python and JavaScript alike) try a
request twice more on 408, 409, 429 and any 5xx unless the answer says
``x-should-retry: false``, waiting what ``Retry-After`` says. yard never
retries on its own, and a client's blind retry would undo that: a backend
whose command fails would be started three times, a deadline that cannot be
met asked three times. So an error where waiting helps (a full queue, too
many connections, yard stopping) carries ``Retry-After``, and every other
error ``x-should-retry: false``.

The server answers its own refusals (a malformed request, too many
connections) in this shape; the APIs answer a :class:`yard.errors.Rejected`
in it (:mod:`yard.api.errors`).
"""

from __future__ import annotations

import json
import math

__all__ = ["error_body", "error_headers", "error_type", "retry_headers"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
}


def error_type(status: int) -> str:
    """The OpenAI error ``type`` for an HTTP status."""
    if status in _TYPES:
        return _TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, code: str, message: str, param: str | None = None) -> bytes:
    """The JSON body of an error answer (``param``: the request's field at fault)."""
    payload = {
        "error": {"message": message, "type": error_type(status), "code": code, "param": param}
    }
    return json.dumps(payload).encode()


def error_headers(body: bytes, retry_after_s: float | None) -> list[tuple[bytes, bytes]]:
    """Content headers of an error answer, and either ``Retry-After`` (when
    given: waiting helps) or ``x-should-retry: false`` (a retry cannot help)."""
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        retry_headers(retry_after_s),
    ]
    return headers


def retry_headers(retry_after_s: float | None) -> tuple[bytes, bytes]:
    """What an error answer tells clients about trying again (see the module)."""
    if retry_after_s is None:
        return (b"x-should-retry", b"false")
    return (b"retry-after", b"%d" % max(1, math.ceil(retry_after_s)))

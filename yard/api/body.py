"""Reading a JSON request body, one way for every route: the data plane's
``model`` (:mod:`yard.http.model_scan`), ``POST /v1/batches`` and ``POST
/v1/announcements``.

A body that is not JSON, not UTF-8, or nested deeper than Python reads is a
400 ``invalid_json`` (a RecursionError of ``json.loads`` was a 500 page on
one route); one that is JSON but not an object is a 400 ``invalid_request``
that names what the route expects.
"""

from __future__ import annotations

import json

from yard.errors import Rejected


def parse_json(raw: bytes | str) -> object:
    """The JSON value of ``raw``. Raises :class:`Rejected` 400 ``invalid_json``."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise Rejected(
            400, "invalid_json", "the JSON body is nested too deeply for yard to read"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise Rejected(400, "invalid_json", f"the body is not valid JSON: {exc}") from None


def json_object(raw: bytes | str, *, expected: str) -> dict[str, object]:
    """The JSON object of ``raw``; ``expected`` says what it should hold (for
    the message). Raises :class:`Rejected` 400 (``invalid_json``,
    ``invalid_request``)."""
    value = parse_json(raw)
    if not isinstance(value, dict):
        raise Rejected(400, "invalid_request", f"send a JSON object: {expected}")
    return value

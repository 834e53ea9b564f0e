"""A batch input file checked line by line, as OpenAI checks it.

Each line is one request: ``{"custom_id": "...", "method": "POST", "url":
"/v1/chat/completions", "body": {"model": "...", ...}}``. Problems are
reported with OpenAI's codes and the 1-based line they are on (a batch with
any goes ``failed`` and lists them in ``errors.data``):

``empty_file``, ``too_many_tasks``, ``invalid_json_line``,
``missing_required_parameter`` (``param`` names what), ``invalid_request``
(a field of the wrong type), ``duplicate_custom_id``, ``invalid_method``,
``url_mismatch`` (not the batch's endpoint), ``model_not_found`` (a model
this yard does not serve to this app), ``request_too_large``.

Also here: :func:`check_metadata` (a batch's ``metadata``) and
:class:`BadRequest`, the error the API answers for a bad field.

Pure: the caller says which models exist for the app (``route``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from yard.batches.records import BatchError, ParsedLines, ParsedRow
from yard.errors import Rejected

MAX_ERRORS = 1000
"""The most entries a failed batch lists; the last one says how many more."""

PAUSE_EVERY = 100
"""How many lines :func:`check_input` checks between two calls of its ``pause``
(about 1-2 ms of work)."""

SPLIT_BYTES = 256 * 2**10
"""How much of the file :func:`check_input` splits into lines (or scans for
line ends) at once, between two calls of its ``pause``: one ``bytes.split``
holds the GIL throughout, 80 ms for a 50 MiB file in one piece."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Checked:
    """The outcome: the lines in submission order (grouped by model, in the
    order the models first appear, file order within a model), or errors."""

    lines: ParsedLines
    errors: tuple[BatchError, ...]


def check_input(
    content: bytes,
    *,
    endpoint: str,
    route: Callable[[str], str | None],
    max_lines: int,
    max_request_bytes: int | None = None,
    pause: Callable[[], None] | None = None,
) -> Checked:
    """Check ``content`` (the input file) for a batch on ``endpoint``.

    route: the backend serving a model for this app, or None if the app may
        not use it (it does not exist, to this app).
    max_lines: the most requests allowed ([jobs] batch_max_lines).
    max_request_bytes: the largest request body a job stores, if limited.
    pause: called after every :data:`PAUSE_EVERY` lines, and between two
        pieces of :data:`SPLIT_BYTES` as the file is split. A caller in a worker
        thread passes ``time.sleep(0)``, which hands the GIL to the event
        loop's thread if it waits for it: else the loop waits up to Python's
        switch interval (5 ms) each time it wakes while a big file is checked.
    """
    requests = _too_many(content, max_lines, pause)
    if requests is not None:
        message = (
            f"the input file holds {requests} requests; a batch takes at most "
            f"{max_lines} ([jobs] batch_max_lines): split it into several batches"
        )
        return Checked(
            lines=ParsedLines(), errors=(BatchError(code="too_many_tasks", message=message),)
        )
    errors: list[BatchError] = []
    parsed: list[ParsedRow] = []
    seen: dict[str, int] = {}
    count = 0
    for count, (number, text) in enumerate(_lines(content, pause), 1):
        if pause is not None and count % PAUSE_EVERY == 0:
            pause()
        line, problem = _check_line(number, text, endpoint, route, max_request_bytes)
        if problem is None and line is not None:
            custom_id = line[1]
            first = seen.setdefault(custom_id, number)
            if first != number:
                problem = BatchError(
                    code="duplicate_custom_id",
                    message=f"custom_id {_short(custom_id)} is already used on line "
                    f"{first}; each request of a batch needs its own custom_id",
                    line=number,
                    param="custom_id",
                )
        if problem is not None:
            errors.append(problem)
        elif line is not None:
            parsed.append(line)
    if count == 0:
        return Checked(
            lines=ParsedLines(),
            errors=(BatchError(code="empty_file", message="the input file has no requests"),),
        )
    if errors:
        if len(errors) > MAX_ERRORS:
            more = len(errors) - MAX_ERRORS + 1
            errors = errors[: MAX_ERRORS - 1]
            errors.append(BatchError(code="too_many_errors", message=f"{more} more errors"))
        return Checked(lines=ParsedLines(), errors=tuple(errors))
    # Grouped by model in the order models first appear, file order within one.
    by_model: dict[str, list[ParsedRow]] = {}
    for row in parsed:  # (line, custom_id, model, backend, url, body)
        by_model.setdefault(row[2], []).append(row)
    return Checked(
        lines=ParsedLines([row for rows in by_model.values() for row in rows]), errors=()
    )


def _lines(content: bytes, pause: Callable[[], None] | None) -> Iterator[tuple[int, bytes]]:
    """The file's requests: (1-based line number, text) of each line that is
    not blank, as ``content.split(b"\\n")`` numbers them, split about
    :data:`SPLIT_BYTES` at a time (``pause`` between two pieces), so that
    no list of every line is made, nor freed at once."""
    number = 0
    start = 0
    while True:
        end = content.find(b"\n", start + SPLIT_BYTES) if start + SPLIT_BYTES < len(content) else -1
        piece = content[start:] if end < 0 else content[start:end]
        for text in piece.split(b"\n"):
            number += 1
            if text.strip():
                yield number, text
        if end < 0:
            return
        start = end + 1
        if pause is not None:
            pause()


def _too_many(content: bytes, max_lines: int, pause: Callable[[], None] | None) -> int | None:
    """How many requests the file holds, where more than ``max_lines``; None
    if not more. Line ends are counted first, :data:`SPLIT_BYTES` at a time:
    the requests are counted one by one only where those are too many."""
    ends = 0
    for start in range(0, len(content), SPLIT_BYTES):
        if start and pause is not None:
            pause()
        ends += content.count(b"\n", start, start + SPLIT_BYTES)
    if ends + 1 <= max_lines:  # the lines, blank ones too
        return None
    requests = sum(1 for _ in _lines(content, pause))
    return requests if requests > max_lines else None


def _check_line(
    number: int,
    text: bytes,
    endpoint: str,
    route: Callable[[str], str | None],
    max_request_bytes: int | None,
) -> tuple[ParsedRow | None, BatchError | None]:
    def fail(code: str, message: str, param: str | None = None) -> tuple[None, BatchError]:
        return None, BatchError(code=code, message=message, line=number, param=param)

    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return fail("invalid_json_line", "this line is not parseable as valid JSON")
    if not isinstance(value, dict):
        return fail("invalid_json_line", "this line is JSON but not an object")
    for name in ("custom_id", "method", "url", "body"):
        if name not in value:
            return fail(
                "missing_required_parameter",
                f"this line has no {name!r}; every request needs custom_id, method, url and body",
                name,
            )
    custom_id = value["custom_id"]
    if not isinstance(custom_id, str) or not custom_id:
        return fail("invalid_request", "custom_id must be a non-empty string", "custom_id")
    if not _utf8(custom_id):
        return fail(
            "invalid_request",
            "custom_id must be valid UTF-8 text; it holds a lone surrogate escape such as \\ud800",
            "custom_id",
        )
    method = value["method"]
    if method != "POST":
        return fail(
            "invalid_method", f"method is {_short(str(method))}; batch requests are POST", "method"
        )
    url = value["url"]
    if not isinstance(url, str):
        return fail("invalid_request", "url must be a string", "url")
    if url != endpoint:
        return fail(
            "url_mismatch",
            f"url {_short(url)} is not the batch's endpoint {endpoint}; every line of a "
            "batch goes to its endpoint",
            "url",
        )
    body = value["body"]
    if not isinstance(body, dict):
        return fail("invalid_request", "body must be a JSON object", "body")
    model = body.get("model")
    if model is None:
        return fail("missing_required_parameter", "body has no 'model'", "body.model")
    if not isinstance(model, str):
        return fail("invalid_request", "body.model must be a string", "body.model")
    backend = route(model)
    if backend is None:
        return fail(
            "model_not_found",
            f"the model {_short(model)} does not exist in this yard; GET /v1/models lists them",
            "body.model",
        )
    raw = json.dumps(body, separators=(",", ":")).encode()
    if max_request_bytes is not None and len(raw) > max_request_bytes:
        return fail(
            "request_too_large",
            f"the body is {len(raw)} bytes; a job stores at most {max_request_bytes} "
            "([jobs] max_request_bytes)",
            "body",
        )
    # A plain tuple, not a ParsedLine: see ParsedLines.
    return (number, custom_id, model, backend, url, raw), None


def _short(text: str) -> str:
    quoted = json.dumps(text)
    return quoted if len(quoted) <= 80 else quoted[:77] + '..."'


class BadRequest(Rejected):
    """A request the Batch API refuses, in OpenAI's error shape (``param``
    named, the fourth argument)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(status, code, message, param=param)


def _utf8(text: str) -> bool:
    """Whether ``text`` can be stored (JSON allows lone surrogates; UTF-8 does not)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_metadata(value: object) -> dict[str, str] | None:
    """OpenAI's metadata: up to 16 string pairs, keys to 64 and values to 512
    characters. Raises :class:`BadRequest`."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or len(value) > 16
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= 64
            and len(v) <= 512
            and _utf8(k)
            and _utf8(v)
            for k, v in value.items()
        )
    ):
        raise BadRequest(
            400,
            "invalid_metadata",
            "metadata must be an object of at most 16 string values, keys up to 64 and "
            "values up to 512 characters",
            "metadata",
        )
    return {str(k): str(v) for k, v in value.items()}

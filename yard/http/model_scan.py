"""Finding the ``model`` a ``/v1`` request names, at a cost the event loop
can bear.

The model must be found before a request can be queued, on the event loop's
thread, so what it costs is bounded:

- a body up to :data:`INLINE_LIMIT` is read at once (a small JSON body with
  ``json.loads``, the fastest and exact: a chat request costs about 3 µs);
- a larger one is *scanned*, never parsed whole: ``json.loads`` of 60 MiB of
  small objects held the loop for 2-6 s, ``parse_qs`` of 60 MiB of ``a=b&``
  for 22-34 s. The scanners below are made of C calls that each look at no
  more than ``_STEP`` bytes, and they are generators that yield between
  steps (:data:`Steps`): :mod:`yard.http.reader` runs them on the loop and
  lets other tasks run every millisecond or so. Not in a worker thread:
  there the scan held the GIL for all but the moments between its steps,
  and the loop, which lets go of the GIL at every system call, waited for it
  each time (up to the 5 ms switch interval, and longer while the OS had the
  worker thread preempted on a busy machine): a ``/healthz`` took tens of ms
  per scan.

The answer is the one parsing the whole body would give (``json.loads``,
``parse_qs``, the multipart field); where there is none, the functions raise
:class:`~yard.h1.errors.Rejected` with a stable code. None of them does I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator
from typing import TypeVar
from urllib.parse import unquote

from yard.api.body import parse_json
from yard.errors import Rejected

_DISPOSITION_NAME = re.compile(rb'(?:^|;)\s*name="([^"]*)"', re.IGNORECASE)

T = TypeVar("T")
Steps = Generator[None, None, T]
"""A scan in steps: each ``next()`` does a bounded piece of work (a C call
over at most _STEP bytes, or a few Python steps) and the value comes with
StopIteration (:func:`complete` runs one to its end at once)."""

INLINE_LIMIT = 64 * 1024
"""Bodies up to this size are read at once; for larger ones the reader runs
:func:`model_steps` a step at a time."""

_STEP = 256 * 1024  # bytes one C call (a find, a regex match) may look at
_MAX_DEPTH = 512  # JSON nesting the scanner follows
_MAX_MODEL = 4096  # bytes of a model name worth decoding
_MAX_PARTS = 100  # multipart parts looked at for the field
_MAX_PART_HEAD = 16 * 1024

_WS = re.compile(rb"[ \t\r\n]*+")
# Up to the next bracket, a quote that opens a string cut by the window's
# end, or the end: runs of other bytes, and whole strings. (Possessive, so
# that a failed match never backtracks.)
_STRING = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_FLAT = rb'(?:[^"\[\]{}]++|' + _STRING + rb")*+"
_RUN = re.compile(_FLAT, re.DOTALL)
# The same, swallowing whole objects and arrays that hold no others: below
# the top level, a request is mostly such (messages, content parts), and one
# C call per container instead of a Python step per bracket is 4x faster.
_RUN_NESTED = re.compile(
    rb'(?:[^"\[\]{}]++|' + _STRING + rb"|\{" + _FLAT + rb"\}|\[" + _FLAT + rb"\])*+", re.DOTALL
)
# The rest of a string after its opening quote, up to a quote or a backslash.
_STRING_PART = re.compile(rb'[^"\\]*+')
# "model" as a JSON string, its letters written plain or as \u escapes.
_MODEL_KEY = re.compile(
    rb'"(?:m|\\u006[dD])(?:o|\\u006[fF])(?:d|\\u0064)(?:e|\\u0065)(?:l|\\u006[cC])"'
)
# A url-encoded field named model (letters plain or percent-encoded).
_FORM_MODEL = re.compile(rb"&(?:m|%6[dD])(?:o|%6[fF])(?:d|%64)(?:e|%65)(?:l|%6[cC])=")
_OVERLAP = 64  # longer than any match of _MODEL_KEY or _FORM_MODEL

_OPENERS = {0x7B: 0x7D, 0x5B: 0x5D}  # { -> }, [ -> ]


def _end(pattern: re.Pattern[bytes], body: bytes, pos: int, stop: int) -> int:
    """Where a match of ``pattern`` (one that always matches) at ``pos`` ends."""
    match = pattern.match(body, pos, stop)
    assert match is not None
    return match.end()


def complete(steps: Steps[T]) -> T:
    """Run ``steps`` to its end at once; its value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _find(body: bytes, needle: bytes, start: int, end: int | None = None) -> Steps[int]:
    """``body.find(needle, start, end)``, one _STEP at a time."""
    end = len(body) if end is None else end
    while start < end:
        stop = min(start + _STEP, end)
        found = body.find(needle, start, min(stop + len(needle) - 1, end))
        if found >= 0:
            return found
        start = stop
        yield
    return -1


def _search(
    pattern: re.Pattern[bytes], body: bytes, start: int, end: int
) -> Steps[re.Match[bytes] | None]:
    """``pattern.search`` over ``body[start:end]``, one _STEP at a time
    (for patterns whose matches are shorter than _OVERLAP)."""
    while start < end:
        stop = min(start + _STEP, end)
        found = pattern.search(body, start, min(stop + _OVERLAP, end))
        if found is not None:
            return found
        start = stop
        yield
    return None


def _skip_ws(body: bytes, pos: int) -> Steps[int]:
    end = len(body)
    while True:
        stop = min(pos + _STEP, end)
        pos = _end(_WS, body, pos, stop)
        if pos < stop or stop == end:
            return pos
        yield


def _string_end(body: bytes, pos: int) -> Steps[int]:
    """The index after the JSON string that opens at ``body[pos]``."""
    end = len(body)
    pos += 1
    while pos < end:
        pos = _end(_STRING_PART, body, pos, min(pos + _STEP, end))
        if pos >= end:
            break
        if body[pos] == 0x22:  # "
            return pos + 1
        if body[pos] == 0x5C:  # \ and the byte it escapes
            pos += 2
        yield
    raise _invalid_json("a string is not terminated")


def _invalid_json(why: str) -> Rejected:
    return Rejected(400, "invalid_json", f"the body is not valid JSON: {why}")


def _no_model() -> Rejected:
    return Rejected(400, "model_required", "the JSON body has no 'model' string")


def _json_model(body: bytes) -> str:
    """:func:`_json_model_steps`, at once."""
    return complete(_json_model_steps(body))


def _json_model_steps(body: bytes) -> Steps[str]:
    """The top-level ``model`` string of a JSON body, found by a scan that
    follows strings and brackets and builds nothing.

    As ``json.loads(body).get("model")`` would answer, for valid JSON: a
    ``"model"`` inside a nested object or inside a string is not it, a key
    written with ``\\u`` escapes is, and of repeated keys the last one wins.
    Only the structure is checked (strings and brackets that close, nothing
    after the end); a body that is invalid deeper down goes on to the backend,
    which answers for it.
    """
    end = len(body)
    pos = yield from _skip_ws(body, 3 if body.startswith(b"\xef\xbb\xbf") else 0)
    if pos == end:
        raise _invalid_json("the body is empty")
    if body[pos] != 0x7B:  # {
        if body[pos] == 0x5B:  # [
            raise _no_model()
        raise _invalid_json("it does not start with an object")
    closers = bytearray()
    value: tuple[int, int] | None = None  # where the last top-level model string is
    segment = pos  # where the text at depth 1 began (after the last bracket)
    run, run_nested = _RUN.match, _RUN_NESTED.match
    while True:
        yield
        stop = min(pos + _STEP, end)
        # (Both always match; at the top level, keys must be seen.)
        found = run(body, pos, stop) if len(closers) <= 1 else run_nested(body, pos, stop)
        pos = found.end()  # type: ignore[union-attr]
        if pos < end and body[pos] == 0x22:  # a string cut by the window
            pos = yield from _string_end(body, pos)
            continue
        if pos == stop and stop < end:
            continue
        if len(closers) == 1:
            value = yield from _model_in(body, segment, pos, value)
        if pos == end:
            raise _invalid_json("an object or array is not closed")
        byte = body[pos]
        closer = _OPENERS.get(byte)
        if closer is not None:
            if len(closers) >= _MAX_DEPTH:
                raise _too_deep()
            closers.append(closer)
        elif not closers or closers.pop() != byte:
            raise _invalid_json(f"unexpected {chr(byte)!r} at byte {pos}")
        pos += 1
        if len(closers) == 1:
            segment = pos
        elif not closers:
            break
    if (yield from _skip_ws(body, pos)) != end:
        raise _invalid_json(f"extra data after the object, at byte {pos}")
    if value is None:
        raise _no_model()
    start, stop = value
    if stop - start > _MAX_MODEL:
        raise Rejected(
            404, "model_not_found", f"no model in this yard has a name of {stop - start} bytes"
        )
    try:
        model = json.loads(body[start:stop])
    except (ValueError, UnicodeDecodeError) as exc:
        raise _invalid_json(f"the 'model' string: {exc}") from None
    if not model:
        raise _no_model()
    return str(model)


def _model_in(
    body: bytes, start: int, end: int, value: tuple[int, int] | None
) -> Steps[tuple[int, int] | None]:
    """Look for ``"model": ...`` members in ``body[start:end]``, text of the
    top-level object between brackets; return where the last one's string
    value is (None once a later one is not a string), else ``value``."""
    while True:
        key = yield from _search(_MODEL_KEY, body, start, end)
        if key is None:
            return value
        start = key.end()
        if key.start() > 0 and body[key.start() - 1] == 0x5C:  # inside a string
            continue
        colon = yield from _skip_ws(body, start)
        if colon >= end or body[colon] != 0x3A:  # a string value "model", not a key
            continue
        first = yield from _skip_ws(body, colon + 1)
        if first < end and body[first] == 0x22:
            start = yield from _string_end(body, first)
            value = (first, start)
        else:
            value = None  # a number, a literal or a container: not a string


def _too_deep() -> Rejected:
    return Rejected(
        400,
        "invalid_json",
        f"the JSON body is nested too deeply for yard to read (over {_MAX_DEPTH} levels)",
    )


def _form_model(body: bytes) -> Steps[str | None]:
    """The first non-empty ``model`` field of a url-encoded form, as
    ``parse_qs(body)["model"][0]`` would read it, without splitting the rest."""
    end = len(body)
    pos = 0
    found = _FORM_MODEL.match(b"&" + body[:_OVERLAP])
    value_start = found.end() - 1 if found is not None else -1
    while True:
        if value_start < 0:
            match = yield from _search(_FORM_MODEL, body, pos, end)
            if match is None:
                return None
            value_start = match.end()
        value_end = yield from _find(body, b"&", value_start)
        if value_end < 0:
            value_end = end
        if value_end > value_start:
            if value_end - value_start > _MAX_MODEL:
                raise Rejected(
                    404,
                    "model_not_found",
                    f"no model in this yard has a name of {value_end - value_start} bytes",
                )
            text = body[value_start:value_end].decode("utf-8", "replace").replace("+", " ")
            return unquote(text, errors="replace")
        pos = value_end
        value_start = -1


def _multipart_field_steps(body: bytes, content_type: bytes, name: bytes) -> Steps[bytes | None]:
    """The value of form field ``name`` in a ``multipart/form-data`` body,
    without copying the rest of it, in steps. None if absent among the first
    100 parts, or the body is malformed."""
    match = re.search(rb'boundary=(?:"([^"]+)"|([^;\s]+))', content_type, re.IGNORECASE)
    if match is None:
        return None
    delimiter = b"--" + (match.group(1) or match.group(2))
    pos = yield from _find(body, delimiter, 0)
    for _ in range(_MAX_PARTS):
        if pos == -1:
            return None
        start = pos + len(delimiter)
        if body[start : start + 2] == b"--":
            return None
        head_end = yield from _find(
            body, b"\r\n\r\n", start, min(start + _MAX_PART_HEAD, len(body))
        )
        if head_end == -1:
            return None
        end = yield from _find(body, b"\r\n" + delimiter, head_end + 4)
        if end == -1:
            return None
        for line in body[start:head_end].split(b"\r\n"):
            field, _, value = line.partition(b":")
            if field.strip().lower() == b"content-disposition":
                found = _DISPOSITION_NAME.search(value)
                if found is not None and found.group(1) == name:
                    return body[head_end + 4 : end]
        pos = end + 2
    return None


def model_of(method: str, content_type: bytes | None, body: bytes) -> str:
    """The ``model`` a ``/v1`` request names (JSON body, multipart or
    url-encoded form field). Raises :class:`Rejected` 400 when there is none.

    Its cost grows with the body: for a body over :data:`INLINE_LIMIT`, run
    :func:`model_steps` a step at a time instead.
    """
    return complete(model_steps(method, content_type, body))


def model_steps(method: str, content_type: bytes | None, body: bytes) -> Steps[str]:
    """:func:`model_of` in steps (:data:`Steps`), each of which looks at no
    more than about 256 KiB of the body."""
    ctype = (content_type or b"").lower()
    if ctype.startswith(b"multipart/form-data"):
        raw = yield from _multipart_field_steps(body, content_type or b"", b"model")
        if raw is None:
            raise Rejected(
                400,
                "model_required",
                f"the form has no 'model' field (among its first {_MAX_PARTS} parts)",
            )
        named = raw.decode("utf-8", "replace").strip()
        if not named:
            raise Rejected(400, "model_required", "the form's 'model' field is empty")
        return named
    if ctype.startswith(b"application/x-www-form-urlencoded"):
        first = yield from _skip_ws(body, 0)
        # (A JSON body under the form type is what `curl -d '{...}'` sends.)
        if body[first : first + 1] != b"{":
            model = yield from _form_model(body)
            if not model:
                raise Rejected(400, "model_required", "the form has no 'model' field")
            return model
    if not body:
        raise Rejected(
            400,
            "model_required",
            f"{method} without a body: yard routes /v1 requests by their 'model' field",
        )
    if len(body) > INLINE_LIMIT:
        return (yield from _json_model_steps(body))
    data = parse_json(body)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not model:
        raise _no_model()
    return model

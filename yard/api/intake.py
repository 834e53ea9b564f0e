"""Reading a data-plane request's headers: who sent it, when it may and must
start, and what yard keeps of them.

The request reader (:mod:`yard.http.reader`) calls these once per request,
before it is scheduled: :func:`authenticate` (API key -> app),
:func:`clamp_priority`, :func:`parse_start_by`, :func:`parse_not_before`,
:func:`flag`; the gateway's ``/v1/models`` and the jobs, Batch and
announcement APIs use some of them too. Each raises
:class:`~yard.h1.errors.Rejected` with a stable code and a message that
says what to do; none of them does I/O. The ``model`` a body names is found
by :mod:`yard.http.model_scan`.
"""

from __future__ import annotations

import itertools
import math
import secrets
import time
from datetime import datetime

from yard.config import AppConfig, Config, local_app
from yard.errors import Rejected
from yard.h1.upstream import Headers
from yard.times import rfc3339_epoch, wall_label

_ID_PREFIX = secrets.token_hex(6)
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """A request id unique to this run of yard (random prefix, then a counter:
    uuid4 cost a system call per request)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


"""The app every request belongs to when no app keys are configured."""


def authenticate(config: Config, authorization: bytes | None) -> tuple[AppConfig, bool]:
    """The app a request belongs to, from its ``Authorization`` header.

    Returns ``(app, consumed)``: ``consumed`` is True when the key was yard's
    (so it is not passed on to the backend). With no app keys configured every
    request belongs to the ``local`` app (server default priority, full
    range). Raises :class:`Rejected` 401 without a key or with one that is
    no app's, as OpenAI does (``openai.AuthenticationError``); 403 is for a
    known app doing what it may not, decided elsewhere.
    """
    if not config.apps:
        return local_app(config), False
    if not authorization:
        raise Rejected(
            401,
            "missing_api_key",
            "no API key: send 'Authorization: Bearer KEY' with the key of your app",
        )
    scheme, _, key = authorization.decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer":
        raise Rejected(
            401,
            "invalid_api_key",
            "the Authorization header needs the word Bearer before the key: send "
            "'Authorization: Bearer KEY'",
        )
    app = config.app_for_key(key.strip())
    if app is None:
        raise Rejected(401, "invalid_api_key", "this API key belongs to no app configured in yard")
    return app, True


def clamp_priority(config: Config, app: AppConfig, value: bytes | None) -> float:
    """The request's base priority: ``X-Yard-Priority`` clamped to the app's
    range, or the app's default. Raises :class:`Rejected` 400 if not a number."""
    low = config.scheduler.min_priority
    if value is None:
        return max(low, min(app.default_priority, app.max_priority))
    try:
        wanted = float(value)
    except ValueError:
        wanted = math.nan
    if not math.isfinite(wanted):
        raise Rejected(
            400,
            "invalid_priority",
            f"X-Yard-Priority must be a number, got {value.decode('latin-1')!r}",
        )
    return max(low, min(wanted, app.max_priority))


def parse_start_by(
    now: float, start_by: bytes | None, start_within: bytes | None, *, wall: float | None = None
) -> float | None:
    """The request's latest start on the engine clock (``now``), from
    ``X-Yard-Start-By`` (RFC 3339) or ``X-Yard-Start-Within`` (seconds).
    Raises :class:`Rejected` 400 when a header is malformed or both are sent."""
    if start_by is not None and start_within is not None:
        raise Rejected(
            400,
            "invalid_deadline",
            "send either X-Yard-Start-By or X-Yard-Start-Within, not both",
        )
    if start_within is not None:
        seconds = _seconds(start_within, "X-Yard-Start-Within", "invalid_deadline")
        _check_range((time.time() if wall is None else wall) + seconds, "Start-Within", "deadline")
        return now + seconds
    if start_by is not None:
        text = start_by.decode("latin-1").strip()
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            raise Rejected(
                400,
                "invalid_deadline",
                "X-Yard-Start-By must be an RFC 3339 time with a zone, like "
                f"2026-05-01T13:58:00Z; got {text!r}",
            )
        _check_range(moment.timestamp(), "Start-By", "deadline")
        current = time.time() if wall is None else wall
        return now + (moment.timestamp() - current)
    return None


def _seconds(value: bytes, header: str, code: str) -> float:
    """A header's number of seconds >= 0; raises :class:`Rejected` 400
    ``code`` naming the header otherwise."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise Rejected(
            400,
            code,
            f"{header} must be a number of seconds >= 0, got {value.decode('latin-1')!r}",
        )
    return seconds


def parse_not_before(
    now: float,
    not_before: bytes | None,
    start_after: bytes | None,
    *,
    wall: float | None = None,
) -> tuple[float | None, str]:
    """The request's earliest start on the engine clock (``now``), from
    ``X-Yard-Not-Before`` (RFC 3339) or ``X-Yard-Start-After`` (seconds), and
    how people read it ("13:50:00Z (X-Yard-Not-Before)"). ``(None, "")``
    without either. Raises :class:`Rejected` 400 ``invalid_window`` when a
    header is malformed or out of range, or both are sent."""
    if not_before is not None and start_after is not None:
        raise Rejected(
            400,
            "invalid_window",
            "send either X-Yard-Not-Before or X-Yard-Start-After, not both",
        )
    current = time.time() if wall is None else wall
    if start_after is not None:
        seconds = _seconds(start_after, "X-Yard-Start-After", "invalid_window")
        _check_range(current + seconds, "Start-After", "window")
        return now + seconds, f"{wall_label(current + seconds, current)} (X-Yard-Start-After)"
    if not_before is not None:
        epoch = parse_rfc3339(not_before.decode("latin-1"), "X-Yard-Not-Before", "invalid_window")
        _check_range(epoch, "Not-Before", "window")
        return now + (epoch - current), f"{wall_label(epoch, current)} (X-Yard-Not-Before)"
    return None, ""


def check_window(not_before: float | None, start_by: float | None) -> None:
    """Refuse a window that closes before it opens (400 ``invalid_window``)."""
    if not_before is not None and start_by is not None and not_before > start_by:
        raise Rejected(
            400,
            "invalid_window",
            "the window closes before it opens: X-Yard-Not-Before / X-Yard-Start-After "
            "is later than X-Yard-Start-By / X-Yard-Start-Within",
        )


def parse_rfc3339(text: str, what: str, code: str) -> float:
    """Epoch seconds of an RFC 3339 time with a zone; 400 ``code`` naming ``what``
    otherwise."""
    epoch = rfc3339_epoch(text)
    if epoch is None:
        raise Rejected(
            400,
            code,
            f"{what} must be an RFC 3339 time with a zone, like 2026-05-01T13:50:00Z; "
            f"got {text.strip()!r}",
        )
    return epoch


def _check_range(epoch: float, header: str, what: str) -> None:
    """Refuse a time (``what``: a deadline, a window's opening) that no RFC
    3339 UTC time can name (past year 9999 or before year 1): it could never
    be shown back in a job's JSON."""
    if not -62135596800.0 < epoch < 253402214400.0:  # 0001-01-01 to 9999-12-31 UTC
        raise Rejected(
            400,
            f"invalid_{what}",
            f"X-Yard-{header} is out of range: the {'time' if what == 'window' else what} "
            "must fall between the years 0001 and 9999 (UTC)",
        )


def without_connection_options(headers: Headers, connection: bytes) -> Headers:
    """Drop the headers a ``Connection`` header names: they are hop-by-hop too."""
    named = {token.strip().lower() for token in connection.split(b",")}
    return [h for h in headers if h[0] not in named]


def flag(value: bytes | None, header: str) -> bool:
    """A true/false header (``true``/``1``/``yes``, ``false``/``0``/``no``);
    False when absent. Raises :class:`Rejected` 400 for anything else."""
    if value is None:
        return False
    text = value.strip().lower()
    if text in (b"true", b"1", b"yes"):
        return True
    if text in (b"false", b"0", b"no"):
        return False
    raise Rejected(400, "invalid_header", f"{header} must be true or false")


def too_large(limit: int) -> Rejected:
    """The 413 for a body over ``server.max_body_bytes``."""
    return Rejected(
        413,
        "body_too_large",
        f"the request body is larger than this yard accepts ({limit} bytes, server.max_body_bytes)",
    )

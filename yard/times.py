"""Wall-clock times as people write and read them (RFC 3339), for every layer
that takes or shows one: the request headers, announcements, job views.
The standard library only; no clock is read here."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339_epoch(text: str) -> float | None:
    """Epoch seconds of an RFC 3339 time with a zone (``2026-05-01T13:50:00Z``),
    or None when ``text`` is not one (no zone is not one either)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def wall_label(epoch: float, current: float) -> str:
    """A wall-clock time as people read it in reasons: ``13:50:00Z`` today (UTC),
    the whole RFC 3339 time on another day."""
    moment = datetime.fromtimestamp(epoch, UTC)
    if moment.date() == datetime.fromtimestamp(current, UTC).date():
        return moment.strftime("%H:%M:%SZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

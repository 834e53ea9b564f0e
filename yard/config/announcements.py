"""Recurring announcements from the configuration (``[[announcements]]``).

``schedule`` is a cron expression (five fields, UTC), evaluated by ``cronsim``
(a maintained evaluator, tested against the odd corners of cron: day-of-month
with day-of-week, ``L``, ``#``) rather than a parser of our own. Each time it
fires, a window of ``window_s`` seconds opens; the announcement service keeps
the next window of each entry announced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from cronsim import CronSim, CronSimError

_KEYS = frozenset({"model", "app", "schedule", "window_s", "count", "priority"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Recurring:
    """One ``[[announcements]]`` entry.

    key: its place in the file (``0``, ``1``, ...), part of its announcements' ids.
    schedule: when each window opens (cron, UTC); window_s: how long it stays open.
    """

    key: int
    model: str
    app: str
    schedule: str
    window_s: float
    count: int
    priority: float


def parse(
    raw: object, *, apps: Sequence[str], models: Sequence[str], where: str = "announcements"
) -> tuple[Recurring, ...]:
    """Check the ``announcements`` array of the configuration; raises
    ``ValueError`` with a message naming the entry and the key."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{where}: must be an array of tables ([[announcements]])")
    out: list[Recurring] = []
    for i, entry in enumerate(raw):
        at = f"announcements[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{at}: must be a table")
        unknown = sorted(str(k) for k in entry if k not in _KEYS)
        if unknown:
            raise ValueError(f"{at}.{unknown[0]}: unknown key (known: {', '.join(sorted(_KEYS))})")
        model = entry.get("model")
        if not isinstance(model, str) or model not in models:
            raise ValueError(
                f"{at}.model: must name a configured model, got {model!r} "
                f"(models: {', '.join(sorted(models)) or 'none'})"
            )
        app = entry.get("app")
        if not isinstance(app, str) or (apps and app not in apps):
            raise ValueError(
                f"{at}.app: must name a configured app, got {app!r} "
                f"(apps: {', '.join(sorted(apps)) or 'none'})"
            )
        schedule = entry.get("schedule")
        if not isinstance(schedule, str):
            raise ValueError(f'{at}.schedule: must be a cron expression, like "50 * * * *"')
        try:
            CronSim(schedule, datetime.now(UTC))
        except CronSimError as exc:
            raise ValueError(
                f"{at}.schedule: {schedule!r} is not a cron expression ({exc}); "
                'five fields, UTC, like "50 * * * *"'
            ) from None
        window = entry.get("window_s")
        if (
            isinstance(window, bool)
            or not isinstance(window, int | float)
            or not 0 < window <= 24 * 3600
        ):
            raise ValueError(
                f"{at}.window_s: must be a number of seconds > 0, at most 86400 (24 h), "
                f"got {window!r}"
            )
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10_000:
            raise ValueError(f"{at}.count: must be a whole number from 1 to 10000, got {count!r}")
        priority = entry.get("priority", 50)
        if isinstance(priority, bool) or not isinstance(priority, int | float):
            raise ValueError(f"{at}.priority: must be a number, got {priority!r}")
        out.append(
            Recurring(
                key=i,
                model=model,
                app=app,
                schedule=schedule,
                window_s=float(window),
                count=count,
                priority=float(priority),
            )
        )
    return tuple(out)


def next_window(entry: Recurring, now: float) -> tuple[float, float]:
    """The window (epochs) open at ``now``, else the next one to open."""
    start = datetime.fromtimestamp(now - entry.window_s, UTC)
    for moment in CronSim(entry.schedule, start):
        opens = moment.timestamp()
        if opens + entry.window_s > now:
            return opens, opens + entry.window_s
    raise AssertionError("a cron schedule that never fires again")  # pragma: no cover


def window_after(entry: Recurring, opens: float) -> tuple[float, float]:
    """The window that opens next after one that opened at ``opens``."""
    moment = next(iter(CronSim(entry.schedule, datetime.fromtimestamp(opens, UTC))))
    return moment.timestamp(), moment.timestamp() + entry.window_s

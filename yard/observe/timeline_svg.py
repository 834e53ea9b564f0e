"""The dashboard's timeline as an SVG picture, drawn on the server (no script).

One row per device, one lane per backend on it, time from the first activity
of the last hour (two minutes ago at least) to the furthest window ahead
(:func:`yard.observe.timeline.build` chooses the span),
a "now" line, a legend, and a ``<title>`` with exact times on every mark:
the past as bars (loading hatched, loaded light, serving dark), announced
windows as dashed boxes labelled "model ×count · app" (stacked so that labels
do not overlap), held requests and jobs as triangles at their not-before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from html import escape
from typing import Any

from yard.observe.timeline import Json, clock

WIDTH = 1100
LABEL_W = 150
RIGHT_PAD = 16
AXIS_H = 40
DEVICE_H = 20
LANE_H = 26
TRACK_H = 17
CHAR_W = 6.4  # an estimate of one character of the 11 px label font
LEGEND_H = 44

_COLORS = {
    "loading": "#7c3aed",
    "loaded": "#86efac",
    "serving": "#15803d",
    "stopping": "#94a3b8",
    "announced": "#dbeafe",
    "announced_line": "#1d4ed8",
    "held": "#b45309",
    "now": "#dc2626",
    "grid": "#e2e8f0",
    "text": "#1d2330",
    "muted": "#64748b",
}

_STYLE = (
    ".tl text{font:11px system-ui,sans-serif;fill:#1d2330}"
    ".tl .muted{fill:#64748b}.tl .dev{font-weight:600}"
    ".tl .now text{fill:#dc2626;font-weight:600}"
    ".tl .window text{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}"
)


def _esc(text: str) -> str:
    return escape(text, quote=True)


def _fit(text: str, width: float) -> str:
    """``text`` cut to about ``width`` pixels, with an ellipsis if cut."""
    room = int(width / CHAR_W)
    if len(text) <= room:
        return text
    return text[: max(0, room - 1)] + "…" if room > 1 else ""


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _tick_step(span_s: float) -> float:
    for minutes in (1, 2, 5, 10, 15, 20, 30, 60):
        if span_s / (minutes * 60) <= 12:
            return minutes * 60.0
    return 7200.0


def window_label(window: Json, lane: Json) -> str:
    """What a window ahead says on the picture: model, count, app."""
    models = lane["models"]
    model = models[0] if len(models) == 1 else lane["backend"]
    if window["kind"] == "held":
        return f"held {model} · {window['app'] or 'local'}"
    return f"{model} ×{window['left']} · {window['app'] or 'local'}"


def _tracks(items: Iterable[tuple[float, float]]) -> list[int]:
    """Greedy rows for intervals (x from, x to) so that none overlap."""
    ends: list[float] = []
    out: list[int] = []
    for left, right in items:
        for i, end in enumerate(ends):
            if left >= end + 4:
                ends[i] = right
                out.append(i)
                break
        else:
            ends.append(right)
            out.append(len(ends) - 1)
    return out


def _label_at(left: float, label: str, x0: float, x1: float) -> tuple[float, float]:
    """Where a window's label starts and ends: just inside its left edge, or,
    near the right end of the picture, moved left so that it ends there."""
    width = CHAR_W * len(label)
    start = left + 4
    if start + width > x1:
        start = max(x0, x1 - width)
    return round(start, 1), start + width


def _x0_of(x: Any) -> float:
    """The left end of the plot of the scale ``x``."""
    return float(x(-math.inf))


def render_svg(document: Json) -> str:
    """The timeline document (:func:`build`) as one ``<svg>`` element."""
    now, start, end = float(document["now"]), float(document["start"]), float(document["end"])
    wall_now = float(document["wall_now"])
    x0, x1 = float(LABEL_W), float(WIDTH - RIGHT_PAD)

    def x(t: float) -> float:
        return round(x0 + (min(max(t, start), end) - start) / (end - start) * (x1 - x0), 1)

    def at(t: float) -> str:
        return clock(wall_now + (t - now))

    body: list[str] = []
    y = float(AXIS_H)
    for device in document["devices"]:
        body.append(
            f'<g class="device" data-row="{_esc(device["name"])}">'
            f'<text class="dev" x="4" y="{y + 14}">{_esc(device["name"])}</text>'
        )
        if not device["lanes"]:
            body.append(
                f'<text class="muted" x="{x0 + 4}" y="{y + 14}">nothing loaded in the last hour,'
                " nothing ahead</text>"
            )
        body.append(f'<line x1="0" x2="{x1}" y1="{y}" y2="{y}" stroke="{_COLORS["grid"]}"/>')
        y += DEVICE_H
        for lane in device["lanes"]:
            y = _lane(body, lane, y, x, at, x1, now)
        body.append("</g>")
    height = y + LEGEND_H
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tl" role="img" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" width="100%" '
        f'aria-label="timeline from {at(start)} to {at(end)}">',
        f"<style>{_STYLE}</style>",
        "<defs>"
        '<pattern id="tl-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)">'
        f'<rect width="6" height="6" fill="#ede9fe"/>'
        f'<rect width="3" height="6" fill="{_COLORS["loading"]}"/></pattern>'
        "</defs>",
    ]
    parts.extend(_axis(document, x, x0, x1, height - LEGEND_H))
    parts.extend(body)
    parts.append(
        f'<g class="now"><line x1="{x(now)}" x2="{x(now)}" y1="{AXIS_H - 22}" '
        f'y2="{height - LEGEND_H}" stroke="{_COLORS["now"]}" stroke-width="2">'
        f"<title>now: {at(now)}</title></line>"
        f'<text x="{x(now)}" y="{AXIS_H - 26}" text-anchor="middle">now</text></g>'
    )
    parts.extend(_legend(height - LEGEND_H + 14, document.get("beyond", 0)))
    parts.append("</svg>")
    return "".join(parts)


def _axis(document: Json, x: Any, x0: float, x1: float, bottom: float) -> list[str]:
    now, start, end, wall_now = (
        document["now"],
        document["start"],
        document["end"],
        document["wall_now"],
    )
    step = _tick_step(end - start)
    first_wall = math.ceil((wall_now + (start - now)) / step) * step
    out = ['<g class="axis">']
    tick = first_wall
    while tick <= wall_now + (end - now):
        t = now + (tick - wall_now)
        px = x(t)
        label = datetime.fromtimestamp(tick, UTC).strftime("%H:%M")
        out.append(
            f'<line x1="{px}" x2="{px}" y1="{AXIS_H - 4}" y2="{bottom}" '
            f'stroke="{_COLORS["grid"]}"/>'
        )
        if abs(px - x(now)) >= 20:  # the now line would run through it
            out.append(
                f'<text class="muted" x="{px}" y="{AXIS_H - 10}" text-anchor="middle">'
                f"{label}</text>"
            )
        tick += step
    out.append(
        f'<text class="muted" x="4" y="{AXIS_H - 10}">UTC</text>'
        f'<line x1="{x0}" x2="{x1}" y1="{bottom}" y2="{bottom}" stroke="#cbd5e1"/></g>'
    )
    return out


def _lane(body: list[str], lane: Json, y: float, x: Any, at: Any, x1: float, now: float) -> float:
    """Draw one backend's lane from ``y``; return where the next one starts."""
    backend = lane["backend"]
    windows = [w for w in lane["windows"] if w["kind"] == "announced"]
    held = [w for w in lane["windows"] if w["kind"] == "held"]
    extents = []
    for window in windows:
        left, right = x(window["opens"]), x(window["closes"])
        text_left, _ = _label_at(left, window_label(window, lane), _x0_of(x), x1)
        text_end = text_left + CHAR_W * len(window_label(window, lane))
        extents.append((min(left, text_left), max(right, text_end)))
    tracks = _tracks(extents)
    count = max(tracks, default=0) + 1 if windows else 1
    height = LANE_H + (count - 1) * TRACK_H
    body.append(
        f'<g class="lane" data-lane="{_esc(backend)}">'
        f'<text x="14" y="{y + 16}">{_esc(_fit(backend, LABEL_W - 18))}'
        f"<title>{_esc(backend)}: {_esc(', '.join(lane['models']) or backend)}</title></text>"
    )
    bar_y, bar_h = y + 5, 14.0
    for span in lane["spans"]:
        end = span["end"]
        left = x(span["start"])
        right = x(end if end is not None else now)
        kind = span["kind"]
        fill = "url(#tl-hatch)" if kind == "loading" else _COLORS[kind]
        until = at(end) if end is not None else "now"
        length = ""
        if end is not None:
            length = f" ({_duration(end - span['start'])})"
        note = f"; {span['note']}" if span["note"] else ""
        inset = 2.0 if kind == "serving" else 0.0
        body.append(
            f'<rect class="span {kind}" x="{left}" y="{bar_y + inset}" '
            f'width="{max(1.0, right - left):.1f}" height="{bar_h - 2 * inset}" fill="{fill}"'
            + (f' stroke="{_COLORS["loading"]}" stroke-width="0.6"' if kind == "loading" else "")
            + f"><title>{_esc(backend)} {kind}: {at(span['start'])} → {until}{length}"
            f"{_esc(note)}</title></rect>"
        )
    for window, track in zip(windows, tracks, strict=True):
        wy = y + 4 + track * TRACK_H
        left, right = x(window["opens"]), x(window["closes"])
        label = window_label(window, lane)
        text_x, _ = _label_at(left, label, _x0_of(x), x1)
        lead = x(window["loads_from"])
        if lead < left:
            body.append(
                f'<line class="lead" x1="{lead}" x2="{left}" y1="{wy + 8}" y2="{wy + 8}" '
                f'stroke="{_COLORS["announced_line"]}" stroke-dasharray="2 2">'
                f"<title>{_esc(backend)} loads ahead from {at(window['loads_from'])}</title></line>"
            )
        title = (
            f"announcement {window['id']} by {window['app'] or 'local'}: {window['left']} "
            f"request(s) for {backend}, {at(window['opens'])} → {at(window['closes'])}, "
            f"priority {window['priority']:g}; loads ahead from {at(window['loads_from'])}"
        )
        body.append(
            f'<g class="window announced" data-id="{_esc(window["id"])}">'
            f'<rect x="{left}" y="{wy}" width="{max(2.0, right - left):.1f}" '
            f'height="{TRACK_H - 2}" '
            f'fill="{_COLORS["announced"]}" stroke="{_COLORS["announced_line"]}" '
            f'stroke-dasharray="4 2"/>'
            f'<text x="{text_x}" y="{wy + 11.5}">{_esc(_fit(label, x1 - text_x))}</text>'
            f"<title>{_esc(title)}</title></g>"
        )
    groups: dict[float, list[Json]] = {}
    for window in held:
        groups.setdefault(x(window["opens"]), []).append(window)
    for px, items in sorted(groups.items()):
        ty = y + height - 9
        first = items[0]
        apps = sorted({w["app"] or "local" for w in items})
        title = (
            f"{len(items)} held request(s) for {backend} ({', '.join(apps)}), "
            f"not before {at(first['opens'])}"
        )
        count_text = f"×{len(items)}" if len(items) > 1 else ""
        body.append(
            f'<g class="held" data-count="{len(items)}">'
            f'<path d="M{px - 5} {ty - 6} L{px + 5} {ty - 6} L{px} {ty + 2} Z" '
            f'fill="{_COLORS["held"]}"/>'
            + (f'<text x="{px + 6}" y="{ty + 1}">{count_text}</text>' if count_text else "")
            + f"<title>{_esc(title)}</title></g>"
        )
    body.append("</g>")
    return y + height


def _legend(y: float, beyond: int) -> list[str]:
    items = [
        ("loading", "url(#tl-hatch)", "loading (start → ready)"),
        ("loaded", _COLORS["loaded"], "loaded, idle"),
        ("serving", _COLORS["serving"], "serving (requests in flight)"),
        ("stopping", _COLORS["stopping"], "stopping"),
        ("announced", _COLORS["announced"], "announced window (model ×count · app)"),
    ]
    out = ['<g class="legend">']
    px = 4.0
    for kind, fill, text in items:
        stroke = f' stroke="{_COLORS["announced_line"]}" stroke-dasharray="4 2"'
        out.append(
            f'<rect x="{px}" y="{y - 9}" width="18" height="11" fill="{fill}"'
            + (stroke if kind == "announced" else "")
            + "/>"
            f'<text x="{px + 23}" y="{y}">{_esc(text)}</text>'
        )
        px += 30 + CHAR_W * len(text)
    out.append(
        f'<path d="M{px} {y - 9} L{px + 10} {y - 9} L{px + 5} {y - 1} Z" fill="{_COLORS["held"]}"/>'
        f'<text x="{px + 15}" y="{y}">held request or job (not before)</text>'
    )
    note = (
        "red line: now · dotted line: when a load ahead starts counting"
        " · hover a mark for exact times"
    )
    if beyond:
        note += f" · {beyond} more window(s) further ahead than 2 h"
    out.append(f'<text class="muted" x="4" y="{y + 18}">{_esc(note)}</text></g>')
    return out

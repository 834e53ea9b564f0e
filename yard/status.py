"""``yard status``: what the dashboard shows, in the terminal.

Reads ``GET /admin/status`` from a running yard and prints devices and their
memory, backends, the queue, recent decisions and failures, and the stored
profiles, as rich tables; on a node of a cluster, every node first (state,
heartbeat age, whether it reaches the database, loaded backends, queues).
``--json`` prints the document as it came.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from yard import target
from yard.config import ConfigError
from yard.observe.dashboard import format_bytes, format_duration

Json = dict[str, Any]

KEY_ENV = target.KEY_ENV
DEFAULT_URL = target.DEFAULT_URL

_STATE_STYLES = {
    "ready": "green",
    "busy": "yellow",
    "starting": "magenta",
    "draining": "cyan",
    "stopping": "cyan",
    "failed": "bold red",
    "stopped": "dim",
}
_KIND_STYLES = {
    "load": "blue",
    "stop": "cyan",
    "dispatch": "green",
    "reject": "red",
    "requeue": "yellow",
    "flag": "dim yellow",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``yard status [--url URL] [--key KEY] [--config FILE] [--json]``."""
    parser.description = (
        "Show a running yard: memory per device, backends, the queue, recent decisions "
        "and failures, stored profiles."
    )
    target.add_target_arguments(
        parser, key_help=f"the admin key (default: ${KEY_ENV}, else server.admin_key of --config)"
    )
    parser.add_argument("--json", action="store_true", help="print the status document as JSON")


def resolve_target(args: argparse.Namespace) -> tuple[str, str | None]:
    """Where yard is and the admin key (:func:`yard.target.resolve_target`)."""
    found = target.resolve_target(args)
    return found.url, found.key


def fetch_status(url: str, key: str | None) -> Json:
    """GET ``URL/admin/status``. Raises :class:`StatusError` with a message
    for people when yard cannot be reached or refuses."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.get(f"{url}/admin/status", headers=headers, timeout=10.0)
    except httpx.HTTPError as exc:
        raise StatusError(f"cannot reach yard at {url} ({exc}); is `yard serve` running?") from exc
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text.strip()[:200]
        hint = (
            f" (give the admin key with --key or ${KEY_ENV})" if response.status_code == 401 else ""
        )
        raise StatusError(f"yard at {url} answered {response.status_code}: {message}{hint}")
    document = response.json()
    if not isinstance(document, dict):
        raise StatusError(f"yard at {url} sent a status that is not a JSON object")
    return document


class StatusError(Exception):
    """``yard status`` could not get the status."""


def _summary(status: Json) -> Text:
    text = Text()
    text.append(f"yard {status.get('version', '?')}", style="bold")
    text.append(f"  up {format_duration(status.get('uptime_s'))}")
    queue = status.get("queue", {})
    text.append(f"  {queue.get('length', 0)} queued")
    inflight = status.get("statistics", {}).get("inflight")
    if inflight is not None:
        text.append(f"  {inflight} in flight")
    if status.get("host_only"):
        text.append("  host-only mode (no GPU found)", style="bold yellow")
    meter = status.get("meter")
    if isinstance(meter, dict) and meter.get("detail"):
        text.append(f"\nmemory meter ({meter.get('mode') or '?'}): {meter['detail']}")
    return text


def _bar(device: Json, width: int = 30) -> Text:
    total = device.get("total_bytes") or 0
    bar = Text()
    if total <= 0:
        return bar
    used = 0
    for share in device.get("backends", []):
        size = max(share.get("reserved_bytes") or 0, share.get("live_bytes") or 0)
        cells = round(width * size / total)
        style = _STATE_STYLES.get(share.get("state", ""), "green")
        bar.append("█" * cells, style=style)
        used += cells
    foreign = round(width * (device.get("foreign_bytes") or 0) / total)
    reserve = round(width * (device.get("reserve_bytes") or 0) / total)
    bar.append("▒" * foreign, style="yellow")
    bar.append("·" * max(0, width - used - foreign - reserve), style="dim")
    bar.append("░" * reserve, style="dim")
    return bar


def _devices(status: Json) -> Table:
    table = Table(title="Memory", title_justify="left", expand=True)
    table.add_column("device", no_wrap=True)
    table.add_column("use", no_wrap=True, min_width=22)
    table.add_column("free", justify="right", no_wrap=True)
    table.add_column("of", justify="right", no_wrap=True)
    table.add_column("details")
    for device in status.get("devices", []):
        name = device["name"] + (" (exclusive)" if device.get("exclusive") else "")
        if device.get("kind") == "gpu" and device.get("per_process") is False:
            name += "\n(device deltas: first loads alone)"
        details = (
            f"live {format_bytes(device.get('live_bytes'))} · "
            f"reserved {format_bytes(device.get('committed_bytes'))} · "
            f"foreign {format_bytes(device.get('foreign_bytes'))} · "
            f"kept free {format_bytes(device.get('reserve_bytes'))}"
        )
        for share in device.get("backends", []):
            details += (
                f"\n{share['backend']}: {format_bytes(share.get('live_bytes'))} live, "
                f"{format_bytes(share.get('reserved_bytes'))} reserved"
            )
        table.add_row(
            name,
            _bar(device, width=20),
            format_bytes(device.get("free_bytes")),
            format_bytes(device.get("total_bytes")),
            details,
        )
    return table


def _nodes(status: Json) -> Table | None:
    """Every node of the cluster (None for a yard on its own)."""
    cluster = status.get("cluster")
    if not isinstance(cluster, dict):
        return None
    here = cluster.get("node")
    title = "Nodes"
    if cluster.get("database") != "ok":
        title += " (this node has lost the shared database: no new claims)"
    table = Table(title=title, title_justify="left", expand=True)
    for column in ("node", "state", "heartbeat", "database", "loaded"):
        table.add_column(column, no_wrap=True)
    table.add_column("queues", overflow="fold")
    for node in cluster.get("nodes", []):
        name = Text(str(node.get("name", "?")), style="bold")
        if node.get("name") == here:
            name.append(" (here)", style="dim")
        state = str(node.get("state", "?"))
        queues = node.get("queues") or {}
        table.add_row(
            name,
            Text(state, style="green" if state == "up" else "bold red"),
            format_duration(node.get("heartbeat_age_s")) + " ago",
            "ok" if node.get("database_ok") else Text("lost", style="bold red"),
            ", ".join(node.get("loaded") or []) or "-",
            ", ".join(f"{b}: {n}" for b, n in sorted(queues.items())) or "-",
        )
    return table


PIPED_WIDTH = 200
"""The width ``yard status`` writes when its output is not a terminal."""

NARROW = 120
"""Below this many columns the reasons go under a table, not in a column of
it (a column a few characters wide put every word on a line of its own)."""


def short_id(request_id: str) -> str:
    """A request id as the queue shows it: its end (synchronous ids share a
    per-run prefix, a batch's lines their batch's), whole if short."""
    return request_id if len(request_id) <= 14 else "…" + request_id[-12:]


def _with_reasons(table: Table, reasons: list[tuple[str, str]], narrow: bool) -> Table | Group:
    """``table``, and when ``narrow`` its rows' reasons below it, one a line."""
    if not narrow or not any(why for _, why in reasons):
        return table
    lines = Text()
    for who, why in reasons:
        if why:
            lines.append(f"{who}: ", style="bold")
            lines.append(why + "\n")
    lines.rstrip()
    return Group(table, lines)


def _backends(status: Json, narrow: bool = False) -> Table | Group:
    table = Table(title="Backends", title_justify="left", expand=True)
    for column in ("backend", "state", "uptime", "slots", "queued", "served", "last load"):
        table.add_column(column, no_wrap=True)
    if not narrow:
        table.add_column("why", overflow="fold", min_width=30)
    reasons: list[tuple[str, str]] = []
    for backend in status.get("backends", []):
        name = Text(backend["name"], style="bold")
        if backend.get("pinned"):
            name.append(" pinned", style="cyan")
        state = backend.get("state", "?")
        shown = Text(state, style=_STATE_STYLES.get(state, ""))
        if backend.get("context"):
            shown.append(f" context {backend['context']}", style="dim")
        if backend.get("parallel"):
            shown.append(f" parallel {backend['parallel']}", style="dim")
        cells: list[Text | str] = [
            name,
            shown,
            format_duration(backend.get("uptime_s")),
            f"{backend.get('inflight', 0)}/{backend.get('slots', 0)}",
            str(backend.get("queued", 0)),
            str(backend.get("served", 0)),
            format_duration(backend.get("last_load_s")),
        ]
        reason = str(backend.get("reason", ""))
        reasons.append((str(backend["name"]), reason))
        table.add_row(*cells, *([] if narrow else [reason]))
    return _with_reasons(table, reasons, narrow)


def _queue(status: Json, narrow: bool = False) -> Table | Group | Text:
    queue = status.get("queue", {})
    items = queue.get("items", [])
    if not items:
        return Text("Queue: nobody is waiting.", style="dim")
    table = Table(
        title=f"Queue ({queue.get('length', len(items))})", title_justify="left", expand=True
    )
    for column in ("#", "request", "app", "backend", "prio", "eff.", "waited", "deadline"):
        table.add_column(column, no_wrap=True)
    if not narrow:
        table.add_column("why", overflow="fold", min_width=30)
    reasons: list[tuple[str, str]] = []
    for item in items:
        deadline = item.get("deadline_in_s")
        cells = [
            str(item.get("position")),
            short_id(str(item.get("request_id", ""))),
            item.get("app") or "-",
            item.get("backend", ""),
            f"{item.get('priority', 0):.1f}",
            f"{item.get('effective_priority', 0):.1f}",
            format_duration(item.get("waited_s")),
            f"in {format_duration(deadline)}" if deadline is not None else "-",
        ]
        reason = str(item.get("reason", ""))
        reasons.append((f"#{item.get('position')}", reason))
        table.add_row(*cells, *([] if narrow else [reason]))
    return _with_reasons(table, reasons, narrow)


def _apps(status: Json) -> Table | None:
    apps = status.get("apps", [])
    if not apps:
        return None
    table = Table(title="Apps", title_justify="left", expand=True)
    for column in ("app", "queued", "served now", "weight", "refused"):
        table.add_column(column, no_wrap=True)
    table.add_column("models", overflow="fold")
    for app in apps:
        refused = app.get("refused") or {}
        table.add_row(
            Text(app.get("name", ""), style="bold"),
            _of_limit(app.get("queued", 0), app.get("max_queued")),
            _of_limit(app.get("inflight", 0), app.get("max_concurrent")),
            f"{app['weight']:g}" if app.get("weight") is not None else "-",
            ", ".join(f"{code} {count}" for code, count in sorted(refused.items())) or "-",
            ", ".join(app["models"]) if app.get("models") is not None else "all",
        )
    return table


def _of_limit(count: int, limit: int | None) -> Text:
    """``3/20`` (red at the limit), or ``3`` without one."""
    if limit is None:
        return Text(str(count))
    return Text(f"{count}/{limit}", style="red" if count >= limit else "")


def _decisions(status: Json, limit: int) -> Table | Text:
    decisions = status.get("decisions", [])[:limit]
    if not decisions:
        return Text("Decisions: none yet.", style="dim")
    table = Table(title="Recent decisions", title_justify="left", expand=True)
    for column in ("ago", "kind", "backend", "why"):
        table.add_column(column, overflow="fold")
    for decision in decisions:
        kind = decision.get("kind", "")
        reason = decision.get("reason", "")
        if decision.get("code"):
            reason = f"[{decision.get('status')} {decision['code']}] {reason}"
        table.add_row(
            format_duration(decision.get("ago_s")),
            Text(kind, style=_KIND_STYLES.get(kind, "")),
            decision.get("backend") or "",
            reason,
        )
    return table


def _failures(status: Json) -> Group | Text:
    failures = status.get("failures", [])
    if not failures:
        return Text("Failures: none.", style="dim")
    parts: list[Panel] = []
    for failure in failures:
        body = Text(failure.get("reason", ""))
        for line in failure.get("log", []):
            body.append("\n" + line, style="dim")
        title = f"{failure.get('kind')} {failure.get('backend') or ''}".strip()
        title += f", {format_duration(failure.get('ago_s'))} ago"
        parts.append(Panel(body, title=title, title_align="left", border_style="red"))
    return Group(Text("Recent failures", style="bold"), *parts)


def _profiles(status: Json) -> Table | Text:
    profiles = status.get("profiles", [])
    if not profiles:
        return Text("Profiles: none stored yet (each backend is measured on its first load).")
    table = Table(title="Profiles (measured peaks)", title_justify="left")
    for column in ("backend", "gpu", "host", "load time"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for profile in profiles:
        table.add_row(
            profile["backend"],
            format_bytes(profile.get("gpu_bytes")),
            format_bytes(profile.get("host_bytes")),
            format_duration(profile.get("load_s")),
        )
    return table


def render(status: Json, console: Console, *, decisions: int = 15) -> None:
    """Print the status document as the terminal dashboard."""
    narrow = console.width < NARROW
    console.print(_summary(status))
    nodes = _nodes(status)
    if nodes is not None:
        console.print(nodes)
    console.print(_devices(status))
    console.print(_backends(status, narrow))
    console.print(_queue(status, narrow))
    apps = _apps(status)
    if apps is not None:
        console.print(apps)
    console.print(_decisions(status, decisions))
    console.print(_failures(status))
    console.print(_profiles(status))


def run(args: argparse.Namespace) -> int:
    """Fetch the status of a running yard and print it; 1 when it cannot."""
    try:
        url, key = resolve_target(args)
        status = fetch_status(url, key)
    except StatusError as exc:
        print(f"yard status: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    render(status, _console())
    return 0


def _console() -> Console:
    """The terminal's console; piped, one wide enough that no table wraps its
    reasons (``$COLUMNS`` if wider)."""
    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=max(PIPED_WIDTH, int(columns) if columns.isdigit() else 0))

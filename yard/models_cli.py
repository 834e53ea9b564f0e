"""``yard models``: the models a running yard serves, with their memory
(measured, or estimated from the model file until the first load), context
range and state. Reads ``GET /admin/status`` as ``yard status`` does.

    MODEL    BACKEND  STATE    MEMORY                     CONTEXT
    alpha    alpha    ready    0.1 GiB host (measured)    2048-8192 (now 8192)
    beta     beta     stopped  0.1 GiB host (estimated)   2048-32768
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from yard import target
from yard.config import ConfigError
from yard.status import StatusError, fetch_status

__all__ = ["add_arguments", "format_models", "run"]

GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``yard models [--url URL] [--key KEY] [--config FILE] [--json]``."""
    parser.description = (
        "List the models of a running yard: backend, state, memory (measured, or "
        "estimated from the model file), context range."
    )
    target.add_target_arguments(
        parser, key_help="the admin key (default: $YARD_ADMIN_KEY, else server.admin_key)"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args: argparse.Namespace) -> int:
    """0, or 1 when yard cannot be reached or refuses."""
    try:
        found = target.resolve_target(args)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        return 2
    try:
        status = fetch_status(found.url, found.key)
    except StatusError as exc:
        print(f"yard models: {exc}", file=sys.stderr)
        return 1
    rows = model_rows(status)
    print(json.dumps(rows, indent=2) if args.json else format_models(rows))
    return 0


def model_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model name (a backend with several models, once each)."""
    rows = []
    for b in status.get("backends", []):
        measured = b.get("profile")
        estimate = b.get("estimate")
        memory = measured or estimate
        kind = "measured" if measured else ("estimated" if estimate else None)
        for model in b.get("models") or [b["name"]]:
            rows.append(
                {
                    "model": model,
                    "backend": b["name"],
                    "state": b.get("state"),
                    "gpu_bytes": memory.get("gpu_bytes") if memory else None,
                    "host_bytes": memory.get("host_bytes") if memory else None,
                    "memory": kind,
                    "context_range": b.get("context_range"),
                    "context": b.get("context"),
                }
            )
    return rows


def format_models(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned table."""
    table = [("MODEL", "BACKEND", "STATE", "MEMORY", "CONTEXT")]
    for row in rows:
        table.append((row["model"], row["backend"], str(row["state"]), _memory(row), _context(row)))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table
    )


def _memory(row: dict[str, Any]) -> str:
    if row["memory"] is None:
        return "unknown until loaded"
    parts = []
    if row["gpu_bytes"]:
        parts.append(f"{row['gpu_bytes'] / GIB:.1f} GiB GPU")
    parts.append(f"{(row['host_bytes'] or 0) / GIB:.1f} GiB host")
    return f"{' + '.join(parts)} ({row['memory']})"


def _context(row: dict[str, Any]) -> str:
    span = row["context_range"]
    text = "-" if not span else (f"{span[0]}" if span[0] == span[1] else f"{span[0]}-{span[1]}")
    if row["context"]:
        text += f" (now {row['context']})"
    return text

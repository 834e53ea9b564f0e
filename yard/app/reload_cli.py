"""``yard reload``: make the yard running on this machine read its
configuration again, and say what came of it.

It sends SIGHUP to the yard that holds the configuration's data directory
(:mod:`yard.datadir`) and waits for the outcome the reload writes
(:mod:`yard.app.reload`): the backends added, removed and changed, or the
errors for which the running configuration was kept (yard logs them too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import tomllib
from pathlib import Path

from yard import datadir
from yard.config import ConfigError, load_config

__all__ = ["add_arguments", "run"]

OUTCOME_FILE = "reload.json"  # yard.app.reload.OUTCOME_FILE, without importing the engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``yard reload [--config FILE] [--data-dir DIR] [--wait SECONDS]``."""
    parser.description = (
        "Make the running yard read its configuration again (SIGHUP): new backends "
        "appear, removed ones drain and stop, changed ones restart when idle; keys and "
        "apps change at once. An invalid file changes nothing."
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="the file yard runs (default: yard.toml)"
    )
    parser.add_argument(
        "--data-dir", type=Path, metavar="DIR", help="the running yard's data directory"
    )
    parser.add_argument(
        "--wait", type=float, default=30.0, metavar="SECONDS", help="for the outcome (30)"
    )


def run(args: argparse.Namespace) -> int:
    """0: reloaded; 1: the file is invalid (nothing changed); 2: no yard runs."""
    path: Path | None = args.config
    if path is None and Path("yard.toml").exists():
        path = Path("yard.toml")
    data_dir: Path | None = args.data_dir
    if path is not None and data_dir is None:
        try:
            data_dir = load_config(path).server.data_dir
        except ConfigError:
            # Invalid: the running yard says why (and keeps its configuration);
            # its data directory is read from the file as written.
            data_dir = _data_dir_as_written(path)
    if data_dir is None and path is None:
        # yard serve --models DIR without a file keeps its data here.
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        data_dir = Path(base) / "yard"
    if data_dir is None:
        print(
            "yard reload: cannot tell the running yard's data directory; give --config FILE "
            "or --data-dir DIR",
            file=sys.stderr,
        )
        return 2
    pid = datadir.holder_pid(data_dir)
    if pid is None:
        print(f"yard reload: no yard is running on {data_dir}", file=sys.stderr)
        return 2
    outcome_path = data_dir / OUTCOME_FILE
    sent = time.time()
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        outcome = _outcome(outcome_path)
        at = outcome.get("at") if outcome is not None else None
        if outcome is not None and isinstance(at, int | float) and at >= sent:
            return _report(pid, outcome)
        time.sleep(0.1)
    print(f"yard reload: sent SIGHUP to pid {pid}; no outcome within {args.wait:g} s")
    return 1


def _data_dir_as_written(path: Path) -> Path | None:
    try:
        with path.open("rb") as f:
            server = tomllib.load(f).get("server", {})
        text = server.get("data_dir", "data") if isinstance(server, dict) else "data"
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if not isinstance(text, str) or "{" in text:
        return None
    where = Path(text).expanduser()
    return where if where.is_absolute() else (path.resolve().parent / where).resolve()


def _outcome(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _report(pid: int, outcome: dict[str, object]) -> int:
    def names(key: str) -> list[str]:
        value = outcome.get(key)
        return [str(v) for v in value] if isinstance(value, list) else []

    if not outcome.get("ok"):
        for line in names("errors"):
            print(line, file=sys.stderr)
        print(
            f"yard reload: the yard (pid {pid}) kept its configuration: the file is invalid",
            file=sys.stderr,
        )
        return 1
    changes = [
        f"{label}: {', '.join(found)}"
        for label, found in (
            ("added", names("added")),
            ("removed (drain, then stop)", names("removed")),
            ("changed (restart once idle)", names("changed")),
        )
        if found
    ]
    print(f"yard reload: reloaded (pid {pid}); " + ("; ".join(changes) or "no backend changed"))
    for line in names("notes"):
        print(f"  {line}")
    return 0

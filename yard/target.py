"""Where a running yard is, for the commands that talk to it over HTTP
(``yard status``, ``yard jobs``, ``yard models``, ``yard reload``).

They all take ``--url``, ``--key`` and ``--config`` and read them the same
way (:func:`resolve_target`); and when yard cannot be reached they say
whether a yard holds the configuration's data directory at all
(:func:`not_reached`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from yard import datadir
from yard.config import load_config

DEFAULT_URL = "http://127.0.0.1:8080"

KEY_ENV = "YARD_ADMIN_KEY"
"""Environment variable read for the admin key when ``--key`` is not given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A running yard: its base URL, the key to send (None: none), and its
    data directory when a configuration named it."""

    url: str
    key: str | None
    data_dir: Path | None = None


def add_target_arguments(parser: argparse.ArgumentParser, *, key_help: str) -> None:
    """``--url``, ``--key`` and ``--config``, the same on every such command."""
    parser.add_argument(
        "--url",
        help=f"where yard listens (default: from --config's [server] listen, else {DEFAULT_URL})",
    )
    parser.add_argument("--key", help=key_help)
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="yard's configuration file (address, key)"
    )


def resolve_target(args: argparse.Namespace, *, key_envs: tuple[str, ...] = (KEY_ENV,)) -> Target:
    """``--url``/``--key`` first, then the first of ``key_envs`` that is set,
    then ``--config`` (its listen address, a wildcard one read as loopback,
    and ``server.admin_key``), else the default URL and no key. Raises
    :class:`yard.config.ConfigError` for a bad ``--config``."""
    url: str | None = args.url
    key: str | None = args.key or next((os.environ[e] for e in key_envs if os.environ.get(e)), None)
    data_dir = None
    if args.config is not None:
        config = load_config(args.config)
        host = config.server.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        url = url or f"http://{host}:{config.server.listen_port}"
        key = key or config.server.admin_key
        data_dir = config.server.data_dir
    return Target(url=(url or DEFAULT_URL).rstrip("/"), key=key, data_dir=data_dir)


def not_reached(target: Target) -> str:
    """Why yard at ``target`` may not answer, for the error message."""
    if target.data_dir is None:
        return "is `yard serve` running?"
    who = datadir.holder(target.data_dir)
    if who is None:
        return f"no yard is running on {target.data_dir}; start it with `yard serve`"
    return f"{who} holds {target.data_dir}"

"""``yard check FILE``: validate a file without starting anything; and the lines
it prints (:func:`exposure`, :func:`warnings`, :func:`summary`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from yard.config.loader import Config, is_loopback, load_config
from yard.config.reading import ConfigError
from yard.core.spec import HOST


def exposure(config: Config) -> list[str]:
    """Who may use yard with this configuration, one line per plane: what
    ``yard check`` prints and ``yard serve`` logs at start."""
    server = config.server
    where = f"{server.listen_host}:{server.listen_port}"
    local = is_loopback(server.listen_host)
    if config.apps:
        data = f"an app key required ({len(config.apps)} app(s))"
    elif local:
        data = f"no key needed, from this machine only ({where})"
    else:
        data = (
            f"NO KEY NEEDED: anybody who can reach {where} may use every model "
            "(server.allow_anonymous = true)"
        )
    if server.admin_key is not None:
        admin = "the admin key required"
    else:
        admin = "no key, from this machine only"
    return [f"data plane: {data}", f"admin API: {admin}"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``yard check CONFIG``."""
    parser.description = (
        "Validate a configuration file without starting anything: print every problem "
        "(file, key, what is wrong) and exit 1, or a short summary and exit 0."
    )
    parser.add_argument("config", type=Path, help="the TOML configuration file")


def run(args: argparse.Namespace) -> int:
    """Print the errors of ``args.config`` (exit 1) or a summary (exit 0)."""
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        count = len(exc.errors)
        print(f"{count} error{'s' if count != 1 else ''}", file=sys.stderr)
        return 1
    for line in warnings(config):
        print(line, file=sys.stderr)
    print(summary(config))
    return 0


def warnings(config: Config) -> list[str]:
    """Problems of a valid file that only show on this machine: a program not
    on PATH, a model file or working directory that does not exist (yet).
    ``yard check`` prints them; they do not make the file invalid."""
    found = []
    if config.server.allow_anonymous and config.apps:
        found.append(
            f"{config.path}: server.allow_anonymous: warning: has no effect while apps have "
            "keys (every data-plane request needs one)"
        )
    for b in config.backends.values():
        key = f"{config.path}: backends.{b.name}"
        program = b.command[0].replace("{python}", sys.executable)
        cwd = b.cwd or config.config_dir
        if "{" not in program:
            if "/" in program:
                target = cwd / program
                if not os.access(target, os.X_OK):
                    found.append(f"{key}.command[0]: warning: {target} is not an executable file")
            elif shutil.which(program) is None:
                found.append(f"{key}.command[0]: warning: {program} is not on PATH")
        if b.model_file is not None and not b.model_file.exists():
            found.append(f"{key}.model_file: warning: {b.model_file} does not exist (yet)")
        if b.cwd is not None and not b.cwd.is_dir():
            found.append(f"{key}.cwd: warning: {b.cwd} is not a directory (yet)")
    return found


def summary(config: Config) -> str:
    """A few lines describing a valid configuration (what ``yard check`` prints)."""
    server = config.server
    models = config.models()
    devices = sorted(
        {HOST, *config.devices, *(gpu for b in config.backends.values() for gpu in b.gpus)}
    )
    lines = [
        f"{config.path}: OK",
        f"  listen:   {server.listen_host}:{server.listen_port}   data_dir: {server.data_dir}",
        f"  backends: {len(config.backends)} ({', '.join(config.backends) or 'none'})",
        f"  models:   {len(models)} ({', '.join(m for m, _ in models) or 'none'})",
        f"  apps:     {len(config.apps)} ({', '.join(config.apps) or 'none'})",
        f"  devices:  {', '.join(devices)}",
        *(f"  access:   {line}" for line in exposure(config)),
    ]
    return "\n".join(lines)

"""``yard check FILE``: validate a file without starting anything; and the lines
it prints (:func:`exposure`, :func:`warnings`, :func:`summary`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from yard.config.folder import model_files
from yard.config.loader import Config, is_loopback, load_config
from yard.config.programs import missing_program
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
    """``yard check [FILE | --config FILE]``."""
    parser.description = (
        "Validate a configuration file without starting anything: print every problem "
        "(file, key, what is wrong) and exit 1, or a short summary and exit 0."
    )
    parser.add_argument(
        "file",
        nargs="?",
        type=Path,
        metavar="FILE",
        help="the TOML configuration file (or --config FILE; default: yard.toml)",
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="the same as FILE")


def run(args: argparse.Namespace) -> int:
    """Print the errors of the file (exit 1) or a summary (exit 0); exit 2
    when it is named twice, differently."""
    if args.file is not None and args.config is not None and args.file != args.config:
        print(
            f"yard check: two files given ({args.file} and --config {args.config}); give one",
            file=sys.stderr,
        )
        return 2
    path = args.config or args.file or Path("yard.toml")
    try:
        config = load_config(path)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        count = len(exc.errors)
        print(f"{count} error{'s' if count != 1 else ''}", file=sys.stderr)
        return 1
    for line in warnings(config):
        print(line, file=sys.stderr)
    problems = errors(config)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        count = len(problems)
        print(f"{count} error{'s' if count != 1 else ''}", file=sys.stderr)
        return 1
    print(summary(config))
    return 0


def errors(config: Config) -> list[str]:
    """Problems of a valid file on this machine that stop a backend from
    ever starting: a program that cannot be found (``{llama_server}`` with
    no llama-server here, a name not on PATH, a path that is not an
    executable). ``yard check`` fails on them, naming the key."""
    found = []
    if config.folder is not None:
        template = config.folder.template
        command = template.get("command")
        if isinstance(command, list):
            env = template.get("env")
            problem = missing_program(
                [str(word) for word in command],
                cwd=config.config_dir,
                env=env if isinstance(env, dict) else None,
            )
            if problem is not None:
                found.append(
                    f"{config.path}: defaults.llama.command[0] (the models folder's): {problem}"
                )
    for b in config.backends.values():
        if b.instance_of is not None:
            continue
        problem = missing_program(b.command, cwd=b.cwd or config.config_dir, env=b.env)
        if problem is not None:
            found.append(f"{config.path}: backends.{b.name}.command[0]: {problem}")
    return found


def warnings(config: Config) -> list[str]:
    """Problems of a valid file that only show on this machine and may be
    fixed before the backend is first needed: a model file or working
    directory that does not exist (yet). ``yard check`` prints them; they do
    not make the file invalid."""
    found = []
    if config.server.allow_anonymous and config.apps:
        found.append(
            f"{config.path}: server.allow_anonymous: warning: has no effect while apps have "
            "keys (every data-plane request needs one)"
        )
    if config.folder is not None and not config.folder.dir.is_dir():
        found.append(
            f"{config.path}: models.dir: warning: {config.folder.dir} is not a directory (yet)"
        )
    for b in config.backends.values():
        if b.instance_of is not None:
            continue
        key = f"{config.path}: backends.{b.name}"
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
        *(
            [
                f"  folder:   {config.folder.dir} ({len(model_files(config.folder.dir))} GGUF "
                "file(s) now; each is a model, named after its file)"
            ]
            if config.folder is not None
            else []
        ),
        f"  apps:     {len(config.apps)} ({', '.join(config.apps) or 'none'})",
        f"  devices:  {', '.join(devices)}",
        *(f"  access:   {line}" for line in exposure(config)),
    ]
    return "\n".join(lines)

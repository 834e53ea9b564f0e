"""``yard init``: a commented starter configuration for this machine.

It writes what a new user would otherwise look up: the devices yard finds
here (with their memory), the models folder if one is given (``--models
DIR``), one app with a key made for it (the key is printed once, the file
keeps only its hash, as ``yard key new`` does), and access from this machine
only. What it writes passes ``yard check`` unchanged.

    yard init --models ~/models --config yard.toml
    yard serve --config yard.toml
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from yard.config import key_digest
from yard.keys import new_key
from yard.memory.readings import format_bytes
from yard.testing.gpu import nvml_from_env

__all__ = ["add_arguments", "render", "run"]

APP = "me"
"""The app ``yard init`` makes a key for."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``yard init [--models DIR] [--config FILE] [--listen HOST:PORT] [--force]``."""
    parser.description = (
        "Write a commented starter configuration for this machine: the devices found, "
        "the models folder, an app key (printed once), access from this machine only. "
        "Without --config it goes to standard output."
    )
    parser.add_argument("--models", type=Path, metavar="DIR", help="a folder of GGUF files")
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="write it here (default: standard output)"
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="default 127.0.0.1:8080"
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing --config")


def run(args: argparse.Namespace) -> int:
    """Write the file (exit 0); 2 when --config exists and --force is not given."""
    target: Path | None = args.config
    if target is not None and target.exists() and not args.force:
        print(
            f"yard init: {target} exists; give --force to overwrite it, or another --config",
            file=sys.stderr,
        )
        return 2
    from yard.memory import default_meter  # the meter is slow to start: only here

    meter = default_meter(nvml=nvml_from_env())
    try:
        devices = {name: meter.device_totals()[name] for name in meter.device_totals()}
        labels = dict(meter.describe())
        how = meter.mode
    finally:
        meter.close()
    key = new_key()
    models = args.models.expanduser().resolve() if args.models is not None else None
    text = render(
        devices=devices,
        labels=labels,
        meter=how,
        models=models,
        listen=args.listen,
        key=key,
    )
    told = (
        f'The key of app "{APP}" (shown this once; the file keeps only its hash):\n\n'
        f"    {key}\n\n"
        "Send it as  Authorization: Bearer KEY  (the openai client: api_key=KEY)."
    )
    if target is None:
        sys.stdout.write(text)
        print(told, file=sys.stderr)
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(0o600)
    print(f"wrote {target}; check it with: yard check --config {target}\n\n{told}")
    return 0


def render(
    *,
    devices: Mapping[str, int],
    labels: Mapping[str, str],
    meter: str,
    models: Path | None,
    listen: str,
    key: str,
) -> str:
    """The starter file for a machine with ``devices`` (name -> bytes)."""
    host = socket.gethostname()
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    found = []
    for name, total in sorted(devices.items()):
        label = labels.get(name, "") if name != "host" else ""
        found.append(f"#   {name}: {format_bytes(total)}" + (f" ({label})" if label else ""))
    lines = [
        f"# yard's configuration, written by `yard init` on {host} ({today}).",
        "# Every key is explained in config/example.toml of yard's source; this file sets",
        "# only what a first start needs. Check it:  yard check --config THIS_FILE",
        "# Run it:  yard serve --config THIS_FILE  (change it while yard runs: yard reload)",
        "",
        "[server]",
        "# From this machine only. To serve the network, listen on 0.0.0.0:8080: every",
        "# request then needs an app key (below), and the admin API an admin_key.",
        f"listen = {json.dumps(listen)}",
        "# Jobs, measured memory profiles, backend logs (relative to this file).",
        'data_dir = "data"',
        "",
        f"# The devices yard found here (its memory meter: {meter}):",
        *found,
        "# yard measures what each model needs and keeps everything loaded within them.",
        "[devices.host]",
        "# Kept free for the rest of the machine.",
        'reserve = "1GiB"',
        "",
    ]
    if models is not None:
        lines += [
            "# Every GGUF file in this folder is a model, named after its file (without",
            "# .gguf), started with llama.cpp's server when a request names it. Files",
            "# added or removed while yard runs appear and disappear (rescan_s).",
            "[models]",
            f"dir = {json.dumps(str(models))}",
            "rescan_s = 10",
            '# More names for a model: aliases = { FILE-NAME = ["alias"] }',
            "",
            "# How each model of the folder is started (optional; this is the default).",
            "# {llama_server} is llama.cpp's server wherever it is on this machine.",
            "# [defaults.llama]",
            '# command = ["{llama_server}", "--host", "{host}", "--port", "{port}",',
            '#            "--model", "{model_file}", "--alias", "{model}",',
            '#            "-c", "{context}", "-np", "1"]',
            "# idle_ttl_s = 900",
            "",
        ]
    else:
        lines += [
            "# A folder of GGUF files serves each as a model:",
            "# [models]",
            '# dir = "/path/to/models"',
            "",
        ]
    lines += [
        "# Or write a backend by hand: any server that speaks HTTP.",
        "# [backends.llm]",
        '# models = ["my-model"]',
        '# command = ["{llama_server}", "--host", "{host}", "--port", "{port}",',
        '#            "--model", "/path/to/model.gguf", "-c", "8192"]',
        "",
        f"# One app, with a key made by `yard init` (yard key new {APP} makes another).",
        "# The key itself was printed once; only its hash is kept here.",
        f"[apps.{APP}]",
        f'key_sha256 = "{key_digest(key).hex()}"',
        "default_priority = 50",
        "",
    ]
    return "\n".join(lines)

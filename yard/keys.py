"""``yard key new APP``: a new random API key for an app, and the line that
keeps only the key's hash in the configuration (``key_sha256``), so the file
can be shared without the secret.

What it prints is valid TOML: comments around the one line to paste, with
the key itself in a comment (it is shown once and kept nowhere).
"""

from __future__ import annotations

import argparse
import re
import secrets
import sys

from yard.config import key_digest

__all__ = ["add_arguments", "describe", "new_key", "run"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

KEY_BYTES = 32
"""Random bytes in a new key (256 bits; 43 URL-safe characters)."""


def new_key() -> str:
    """A new random API key (URL-safe text, :data:`KEY_BYTES` random bytes)."""
    return secrets.token_urlsafe(KEY_BYTES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``yard key new APP``."""
    parser.description = "Manage app keys."
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = actions.add_parser(
        "new",
        help="print a new random key for an app and the key_sha256 line for its [apps.APP]",
        description="Print a new random API key for APP (shown once: nothing keeps it) and "
        'the key_sha256 = "..." line to paste into [apps.APP] of the configuration in '
        "place of key or key_env. The output is valid TOML.",
    )
    new.add_argument("app", help="the app's name, as in [apps.APP]")


def run(args: argparse.Namespace) -> int:
    """Print a new key for ``args.app`` (exit 0), or why the name is wrong (exit 2)."""
    name: str = args.app
    if not _NAME.match(name):
        print(
            f"yard key new: {name!r} is not an app name (letters, digits, '_', '.', '-', "
            "starting with a letter or digit)",
            file=sys.stderr,
        )
        return 2
    print(describe(name, new_key()))
    return 0


def describe(app: str, key: str) -> str:
    """What ``yard key new`` prints for ``app`` and its new ``key``."""
    table = f"apps.{app}" if _BARE_KEY.match(app) else f'apps."{app}"'
    return "\n".join(
        [
            f"# A new API key for app {app!r}. It is shown this once: yard keeps only its hash.",
            "# Give it to the app (it sends Authorization: Bearer KEY):",
            "#",
            f"#     {key}",
            "#",
            f"# Paste this line into [{table}] in place of key or key_env:",
            f'key_sha256 = "{key_digest(key).hex()}"',
        ]
    )

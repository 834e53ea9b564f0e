"""The ``yard`` command line: one subcommand per module.

Each subcommand lives in its owner's module, which exposes
``add_arguments(parser)`` and ``run(args) -> int``. The table below maps the
name to that module; it is imported only when the subcommand is used, so
``yard --help`` and every other subcommand work even while one module is
missing or broken.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast


class Command(NamedTuple):
    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "serve": Command("yard.app.serve", "run the gateway"),
    "check": Command("yard.config", "validate a configuration file without starting anything"),
    "probe": Command("yard.app.probe", "measure one model's memory and load time"),
    "status": Command("yard.status", "show a running yard in the terminal"),
    "jobs": Command("yard.jobs.cli", "list, inspect and cancel async jobs"),
    "key": Command("yard.keys", "make a new app key (yard key new APP)"),
    "models": Command("yard.models_cli", "list a running yard's models: memory, context, state"),
    "init": Command("yard.init", "write a starter configuration for this machine"),
    "reload": Command("yard.app.reload_cli", "make the running yard read its configuration again"),
}


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="yard",
        description="yard: a bouncer for the GPU. One HTTP gateway that schedules, "
        "loads and stops the local model servers of one machine.",
    )
    from yard import __version__

    parser.add_argument("--version", action="version", version=f"yard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    subparsers = {
        name: sub.add_parser(name, help=command.help, description=command.help)
        for name, command in COMMANDS.items()
    }
    return parser, subparsers


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``yard`` script; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser, subparsers = _parser()
    name = _chosen(args_list)
    run: Callable[[argparse.Namespace], int] | None = None
    if name is not None:
        module_path = COMMANDS[name].module
        try:
            module = importlib.import_module(module_path)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_path.startswith(exc.name):
                raise
            print(
                f"yard {name}: not available in this installation ({module_path} is missing)",
                file=sys.stderr,
            )
            return 2
        add_arguments = cast(Callable[[argparse.ArgumentParser], None], module.add_arguments)
        add_arguments(subparsers[name])
        run = cast(Callable[[argparse.Namespace], int], module.run)
        args_list = hoist(args_list, name, subparsers[name])
    args = parser.parse_args(args_list)
    if run is None:  # pragma: no cover - argparse exits first for unknown commands
        parser.error("choose a command")
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


def hoist(argv: Sequence[str], command: str, parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` with every option of ``command``'s own ``parser`` (and its
    value) moved right after the command word, so that it may be written
    anywhere: after a positional argument or after an action's name. Words
    after ``--`` stay where they are."""
    takes_value: dict[str, bool] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        for option in action.option_strings:
            takes_value[option] = action.nargs != 0
    words = list(argv)
    at = words.index(command) + 1
    head, moved, rest = words[:at], [], []
    i = at
    while i < len(words):
        word = words[i]
        if word == "--":
            rest.extend(words[i:])
            break
        name = word.split("=", 1)[0]
        if name in takes_value:
            moved.append(word)
            if takes_value[name] and "=" not in word and i + 1 < len(words):
                moved.append(words[i + 1])
                i += 1
        else:
            rest.append(word)
        i += 1
    return head + moved + rest


if __name__ == "__main__":
    sys.exit(main())

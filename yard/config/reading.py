"""The configuration's reading tools: :class:`ConfigError`, the reader that walks
the TOML tree collecting every error with its key path, sizes, addresses, paths and
placeholders.
"""

from __future__ import annotations

import difflib
import math
import re
import string
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

PLACEHOLDERS: Mapping[str, str] = {
    "port": "the free loopback port yard chose for this backend",
    "host": "the address it must listen on (127.0.0.1)",
    "model": "the first model name the backend serves",
    "model_file": "the backend's model_file, as an absolute path",
    "gpus": "the CUDA indices of the GPUs it was placed on, comma-separated",
    "data_dir": "yard's data directory, absolute",
    "config_dir": "the directory of the configuration file, absolute",
    "python": "the Python interpreter running yard (to start Python backends)",
    "llama_server": "llama.cpp's server wherever it is on this machine (first word of command "
    "only; see yard.config.programs)",
    "context": "the context size chosen for this start, within the backend's context range",
    "parallel": "the slot count chosen for this start, within the backend's parallel range",
    "total_context": "context x parallel (llama-server's -c when each -np slot gets {context})",
}
"""Placeholders allowed in ``command`` and ``env`` values, with their meaning."""

PATH_PLACEHOLDERS = ("data_dir", "config_dir")
"""Placeholders allowed in ``cwd`` and ``model_file`` (known before any launch)."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

_GPU = re.compile(r"^gpu(\d+)$")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

T = TypeVar("T")


class ConfigError(Exception):
    """The configuration is invalid.

    ``errors``: every problem found, each ``"FILE: key.path: what is wrong,
    what to do"``.
    """

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as ``"2GiB"``, ``"512 MiB"``,
    ``"1.5GB"``. Binary units: KiB MiB GiB TiB; decimal: KB MB GB TB.

    Raises ValueError with a message saying what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 2GiB or a number of bytes, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {value}")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            number, unit = match.groups()
            factor = _UNITS.get(unit.lower())
            if factor is not None:
                return int(float(number) * factor)
            raise ValueError(
                f"unknown unit {unit!r} in {value!r}; use B, KiB, MiB, GiB, TiB "
                "(or KB, MB, GB, TB for powers of ten)"
            )
    raise ValueError(f"expected a size like 2GiB or a number of bytes, got {value!r}")


def parse_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` / ``"[::1]:8080"`` / ``"localhost:8080"`` -> (host, port)."""
    if value.startswith("["):
        host, sep, port_text = value[1:].partition("]:")
    else:
        host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT such as 127.0.0.1:8080, got {value!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"the port in {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"the port in {value!r} is out of range (0-65535)")
    return host, port


class _Reader:
    """Walks the TOML tree, collecting every error with its key path."""

    def __init__(self, path: Path, env: Mapping[str, str]) -> None:
        self.path = path
        self.env = env
        self.errors: list[str] = []

    def error(self, key: str, message: str) -> None:
        self.errors.append(f"{self.path}: {key}: {message}")

    def table(self, data: Mapping[str, Any], key: str, name: str) -> dict[str, Any]:
        """The sub-table ``name`` of ``data`` (``{}`` if absent or wrong)."""
        value = data.get(name, {})
        if not isinstance(value, dict):
            self.error(
                _join(key, name), f"must be a table ([{_join(key, name)}]), got {_kind(value)}"
            )
            return {}
        return value

    def known(self, data: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> None:
        """Report every key of ``data`` not in ``allowed``, suggesting the nearest."""
        for name in data:
            if name not in allowed:
                near = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                self.error(
                    _join(key, name),
                    f"unknown key{hint} (known here: {', '.join(allowed)})",
                )

    def get(
        self,
        data: Mapping[str, Any],
        key: str,
        name: str,
        kind: type[T] | tuple[type, ...],
        default: T,
        check: Callable[[Any], str | None] | None = None,
    ) -> T:
        """``data[name]`` if present and of the right type, else ``default``
        (after recording an error if present but wrong)."""
        if name not in data:
            return default
        value = data[name]
        types = kind if isinstance(kind, tuple) else (kind,)
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        # TOML booleans are ints to Python; never accept one for a number.
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types):
            self.error(_join(key, name), f"must be {_describe(types)}, got {_kind(value)}")
            return default
        if isinstance(value, float) and not math.isfinite(value):
            self.error(_join(key, name), f"must be a finite number, got {value}")
            return default
        if check is not None:
            problem = check(value)
            if problem:
                self.error(_join(key, name), problem)
                return default
        return cast(T, value)

    def optional(
        self, data: Mapping[str, Any], key: str, name: str, check: Callable[[Any], str | None]
    ) -> float | None:
        """An optional number: None when absent (or wrong, after an error)."""
        if name not in data:
            return None
        before = len(self.errors)
        value = self.get(data, key, name, float, 0.0, check)
        return value if len(self.errors) == before else None

    def size(self, data: Mapping[str, Any], key: str, name: str, default: int) -> int:
        if name not in data:
            return default
        try:
            return parse_size(data[name])
        except ValueError as exc:
            self.error(_join(key, name), str(exc))
            return default

    def secret(self, data: Mapping[str, Any], key: str, inline: str, from_env: str) -> str | None:
        """A secret given inline (``inline``) or by environment variable name
        (``from_env``); None if neither is given."""
        if inline in data and from_env in data:
            self.error(key, f"give either {inline} or {from_env}, not both")
            return None
        value = self.get(data, key, inline, str, "", _non_empty)
        if value:
            return value
        var = self.get(data, key, from_env, str, "", _non_empty)
        if not var:
            return None
        secret = self.env.get(var)
        if secret is None:
            self.error(
                _join(key, from_env),
                f"environment variable {var} is not set; export {var}=... before starting yard",
            )
            return None
        if not secret:
            self.error(_join(key, from_env), f"environment variable {var} is empty")
            return None
        return secret


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


_KINDS: dict[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a table",
}
"""TOML's value types as a message names them."""


def _kind(value: object) -> str:
    return f"{_KINDS.get(type(value), type(value).__name__)} ({value!r})"


def _describe(types: tuple[type, ...]) -> str:
    # What is asked for: a boolean is written true or false.
    names = {**_KINDS, bool: "true or false"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _non_empty(value: str) -> str | None:
    return None if value else "must not be empty"


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be greater than 0, got {value}"


def _non_negative(value: float) -> str | None:
    return None if value >= 0 else f"must not be negative, got {value}"


def _placeholders(text: str, allowed: tuple[str, ...] | Mapping[str, str]) -> str | None:
    """None if ``text`` is a valid format string using only ``allowed`` fields."""
    try:
        fields = [
            name for _, name, spec, conv in string.Formatter().parse(text) if name is not None
        ]
    except ValueError as exc:
        return f"{exc} in {text!r}; write {{{{ and }}}} for literal braces"
    for name in fields:
        if name not in allowed:
            near = difflib.get_close_matches(name, list(allowed), n=1)
            hint = f"; did you mean {{{near[0]}}}?" if near else ""
            return (
                f"unknown placeholder {{{name}}} in {text!r}{hint} "
                f"(known: {', '.join('{' + p + '}' for p in allowed)})"
            )
    return None


def _path(r: _Reader, key: str, text: str, data_dir: Path | None) -> Path | None:
    """An absolute path from ``text`` (relative to the config file), with
    ``{config_dir}`` and, when known, ``{data_dir}`` filled in."""
    allowed = PATH_PLACEHOLDERS if data_dir is not None else ("config_dir",)
    problem = _placeholders(text, allowed)
    if problem:
        r.error(key, problem)
        return None
    return _expand(text, r.path.parent, data_dir)


def _expand(text: str, config_dir: Path, data_dir: Path | None) -> Path:
    values = {"config_dir": str(config_dir), "data_dir": str(data_dir)}
    expanded = Path(text.format_map(values)).expanduser()
    return expanded if expanded.is_absolute() else (config_dir / expanded).resolve()


def _str_list(r: _Reader, table: Mapping[str, Any], key: str, name: str) -> tuple[str, ...]:
    value = table.get(name, [])
    if not isinstance(value, list):
        r.error(f"{key}.{name}", f"must be a list of strings, got {_kind(value)}")
        return ()
    items = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            items.append(item)
        else:
            r.error(f"{key}.{name}[{i}]", f"must be a non-empty string, got {_kind(item)}")
    return tuple(items)


def _url_path(value: str) -> str | None:
    return None if value.startswith("/") else f"must start with '/', got {value!r}"


def _as_toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"

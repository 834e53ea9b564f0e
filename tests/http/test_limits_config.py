"""The [server] keys of the connection limits: read, checked, handed to the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from yard.config import ConfigError, load_config
from yard.h1.server import Limits


def _load(tmp_path: Path, server: str) -> Limits:
    path = tmp_path / "yard.toml"
    path.write_text(f'[server]\ndata_dir = "{tmp_path}"\n{server}')
    return Limits.from_config(load_config(path).server)


def test_the_limits_default_and_are_read_from_the_server_table(tmp_path: Path) -> None:
    assert _load(tmp_path, "") == Limits()
    assert _load(
        tmp_path,
        "keep_alive_s = 5\nhead_timeout_s = 2.5\nbody_timeout_s = 7\nsend_timeout_s = 9\n"
        "max_connections = 50\nreserved_connections = 0\n",
    ) == Limits(
        keep_alive_s=5.0,
        head_timeout_s=2.5,
        body_timeout_s=7.0,
        send_timeout_s=9.0,
        max_connections=50,
        reserved_connections=0,
    )


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("head_timeout_s = 0", "server.head_timeout_s: must be greater than 0"),
        ("body_timeout_s = -1", "server.body_timeout_s: must be greater than 0"),
        ('send_timeout_s = "x"', "server.send_timeout_s: must be a number"),
        ("keep_alive_s = 0", "server.keep_alive_s: must be greater than 0"),
        ("max_connections = 0", "server.max_connections: must be greater than 0"),
        ("max_connections = 1.5", "server.max_connections: must be an integer"),
        ("reserved_connections = -1", "server.reserved_connections: must not be negative"),
    ],
)
def test_a_bad_limit_is_an_error_naming_its_key(tmp_path: Path, line: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, line + "\n")
    assert any(error in message for message in caught.value.errors), caught.value.errors


def test_the_example_configuration_documents_every_limit() -> None:
    example = (Path(__file__).parents[2] / "config" / "example.toml").read_text()
    for name in Limits.__dataclass_fields__:
        assert f"\n{name} = " in example, name

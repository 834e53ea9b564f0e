"""``[cluster]``: every key read, every error naming its key, and nothing
changed for a file without it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from yard.config import ConfigError, load_config
from yard.config.cluster import CLUSTER_KEYS, ClusterConfig, default_node_name

REPO = Path(__file__).resolve().parents[2]

BACKEND = """
[backends.llm]
models = ["m1"]
command = ["server", "--port", "{port}"]
"""


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ClusterConfig | None:
    path = tmp_path / "yard.toml"
    path.write_text(textwrap.dedent(text) + BACKEND)
    return load_config(path, env=env or {}).cluster


def errors_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, env)
    return info.value.errors


def test_without_a_cluster_table_there_is_no_cluster(tmp_path: Path) -> None:
    assert load(tmp_path, "") is None


def test_every_cluster_key_is_read(tmp_path: Path) -> None:
    cluster = load(
        tmp_path,
        """
        [cluster]
        database = "postgresql://yard@db/yard"
        node = "gpu-1"
        url = "http://gpu-1.lan:8080/"
        secret = "s3cret"
        heartbeat_s = 1
        dead_after_s = 4
        claim_ahead = 2
        connect_timeout_s = 3
        idle_in_transaction_s = 20
        lock_timeout_s = 4.5
        statement_timeout_s = 90
        """,
    )
    assert cluster == ClusterConfig(
        database="postgresql://yard@db/yard",
        node="gpu-1",
        url="http://gpu-1.lan:8080",
        secret="s3cret",
        heartbeat_s=1.0,
        dead_after_s=4.0,
        claim_ahead=2,
        connect_timeout_s=3.0,
        idle_in_transaction_s=20.0,
        lock_timeout_s=4.5,
        statement_timeout_s=90.0,
    )


def test_defaults_node_from_the_host_name_and_url_from_the_listen_address(
    tmp_path: Path,
) -> None:
    path = tmp_path / "yard.toml"
    path.write_text(
        "[server]\nlisten = '127.0.0.1:9123'\n[cluster]\ndatabase = 'host=/tmp dbname=y'\n"
        + BACKEND
    )
    config = load_config(path, env={})
    cluster = config.cluster
    assert cluster is not None
    assert cluster.node == default_node_name()
    assert cluster.secret is None
    assert (cluster.heartbeat_s, cluster.dead_after_s, cluster.claim_ahead) == (2.0, 10.0, 0)
    assert cluster.node_url(config.server) == "http://127.0.0.1:9123"
    moved = config.with_overrides(listen="127.0.0.1:9200")
    assert moved.cluster is not None
    assert moved.cluster.node_url(moved.server) == "http://127.0.0.1:9200"


def test_database_and_secret_come_from_the_environment(tmp_path: Path) -> None:
    cluster = load(
        tmp_path,
        """
        [cluster]
        database_env = "YARD_DATABASE_URL"
        secret_env = "YARD_CLUSTER_SECRET"
        """,
        env={"YARD_DATABASE_URL": "postgresql:///yard", "YARD_CLUSTER_SECRET": "x"},
    )
    assert cluster is not None
    assert (cluster.database, cluster.secret) == ("postgresql:///yard", "x")


def test_an_unset_database_variable_is_named(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, "[cluster]\ndatabase_env = 'YARD_DATABASE_URL'\n")
    assert len(errors) == 1
    assert "cluster.database_env: environment variable YARD_DATABASE_URL is not set" in errors[0]


def test_a_cluster_without_a_database_is_refused(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, "[cluster]\nnode = 'a'\n")
    assert len(errors) == 1
    assert ": cluster: needs the PostgreSQL database" in errors[0]
    assert "database_env" in errors[0]


@pytest.mark.parametrize(
    ("line", "key", "says"),
    [
        ("database = 'mysql://x'", "cluster.database", "not a PostgreSQL connection string"),
        ("database = 'postgresql:///y'\nnode = 'a b'", "cluster.node", "not a node name"),
        ("database = 'postgresql:///y'\nurl = 'gpu1:8080'", "cluster.url", "http://HOST:PORT"),
        ("database = 'postgresql:///y'\nurl = 'http://a:1/x'", "cluster.url", "without a path"),
        ("database = 'postgresql:///y'\nheartbeat_s = 0", "cluster.heartbeat_s", "greater than 0"),
        (
            "database = 'postgresql:///y'\nheartbeat_s = 3\ndead_after_s = 5",
            "cluster.dead_after_s",
            "less than two heartbeats",
        ),
        ("database = 'postgresql:///y'\nclaim_ahead = -1", "cluster.claim_ahead", "negative"),
        (
            "database = 'postgresql:///y'\nlock_timeout_s = inf",
            "cluster.lock_timeout_s",
            "must be a finite number",
        ),
        (
            "database = 'postgresql:///y'\nstatement_timeout_s = 0",
            "cluster.statement_timeout_s",
            "greater than 0",
        ),
        ("database = 'postgresql:///y'\nsecret = ''", "cluster.secret", "must not be empty"),
        (
            "database = 'postgresql:///y'\nsecret = 'a'\nsecret_env = 'B'",
            "cluster",
            "either secret or secret_env",
        ),
        ("database = 'postgresql:///y'\nheartbeet_s = 1", "cluster.heartbeet_s", "heartbeat_s"),
    ],
)
def test_a_bad_key_is_named_with_what_is_wrong(
    tmp_path: Path, line: str, key: str, says: str
) -> None:
    errors = errors_of(tmp_path, "[cluster]\n" + line + "\n")
    assert len(errors) == 1, errors
    assert f": {key}: " in errors[0]
    assert says in errors[0]


def test_a_longer_heartbeat_moves_the_default_dead_after(tmp_path: Path) -> None:
    cluster = load(tmp_path, "[cluster]\ndatabase = 'postgresql:///y'\nheartbeat_s = 7\n")
    assert cluster is not None
    assert cluster.dead_after_s == 14.0


def test_the_example_documents_every_cluster_key() -> None:
    text = (REPO / "config" / "example.toml").read_text()
    assert "# [cluster]" in text
    missing = [key for key in CLUSTER_KEYS if f"# {key} =" not in text]
    assert missing == []

"""Fixtures of the cluster tests: a real PostgreSQL (see :mod:`yard.testing.postgres`).

``postgres_server``: one server per test module, stopped after it.
``postgres_dsn``: a fresh, empty database on that server for each test,
dropped after it (a DSN over TCP on 127.0.0.1).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from yard.testing.postgres import PostgresMissing, PostgresServer, start_postgres


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        with start_postgres() as server:
            yield server
    except PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    name = postgres_server.create_database()
    try:
        yield postgres_server.dsn(name)
    finally:
        postgres_server.drop_database(name)

"""A client is served while an attacker keeps far more slow heads open than
yard's connection cap (or its open-file limit) allows, reconnecting those yard
closes: bench.abuse's slow-1000 at a smaller scale, from its own process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.edge.conftest import APP, APPS, FAST_LOST
from tests.edge.harness import ROOT, Yard, get, healthz_answers, liar_toml, start_yard
from tests.edge.test_slow import MAX_CONNECTIONS, tight  # noqa: F401

pytestmark = pytest.mark.slow


@contextmanager
def slow_heads(yard: Yard, count: int) -> Iterator[None]:
    """``count`` connections sending their heads a byte a second, reopened
    when yard closes them (``python -m bench.abuse _attack slow-1000``)."""
    command = ["-m", "bench.abuse", "_attack", "slow-1000", "--port", str(yard.port)]
    attacker = subprocess.Popen(
        [sys.executable, *command, "--count", str(count)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert attacker.stdout is not None
        assert attacker.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        yield
    finally:
        attacker.kill()
        attacker.wait()
        if attacker.stdout is not None:
            attacker.stdout.close()


def _served(yard: Yard) -> list[int]:
    statuses = []
    with healthz_answers(yard, min_s=1.0):
        for _ in range(20):
            statuses.append(get(yard, "/backends/liar/ok", headers=APP).status)
            time.sleep(0.05)
    return statuses


def test_a_client_is_served_while_slow_heads_churn_past_the_cap(tight: Yard) -> None:  # noqa: F811
    with slow_heads(tight, MAX_CONNECTIONS * 3):
        statuses = _served(tight)
    assert statuses == [200] * 20, statuses


def test_a_client_is_served_while_slow_heads_churn_past_the_open_file_limit(
    tmp_path: Path,
) -> None:
    yard = start_yard(tmp_path, APPS + liar_toml() + FAST_LOST, nofile=256)
    try:
        with slow_heads(yard, 600):
            statuses = _served(yard)
    finally:
        yard.stop()
    assert statuses == [200] * 20, statuses


@pytest.mark.parametrize("path", ["/dashboard/login", "/v1/chat/completions"])
def test_heads_whose_body_never_comes_make_room_for_new_clients(
    tight: Yard,  # noqa: F811
    path: str,
) -> None:
    waiting = []
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    try:
        for _ in range(MAX_CONNECTIONS * 3):
            sock = tight.connect()
            sock.sendall(head)
            waiting.append(sock)
        time.sleep(0.3)
        statuses = [get(tight, "/backends/liar/ok", headers=APP).status for _ in range(5)]
    finally:
        for sock in waiting:
            sock.close()
    assert statuses == [200] * 5, statuses

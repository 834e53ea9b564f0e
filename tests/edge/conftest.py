"""Fixtures of the bad-input suite: real ``yard serve`` processes, one per
module and configuration (starting one costs a second or two), stopped at
the end with a check that no backend process is left behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.edge.harness import Yard, echo_toml, liar_toml, start_yard

ADMIN_KEY = "edge-admin-key"
APP_KEY = "edge-app-key"
OTHER_KEY = "edge-other-key"
APPS = (
    f'[apps.edge]\nkey = "{APP_KEY}"\ndefault_priority = 50\nmax_priority = 90\n\n'
    f'[apps.other]\nkey = "{OTHER_KEY}"\ndefault_priority = 50\nmax_priority = 90\n\n'
)
# A backend answer that breaks the protocol ends as upstream_lost: the core
# waits lost_grace_s for an exit report (5 s by default) before its 502.
FAST_LOST = "[scheduler]\nlost_grace_s = 0.5\n\n"
APP = {"Authorization": f"Bearer {APP_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    """yard with an admin key and app keys, the test backend (model ``tiny``)
    and the lying backend (``/backends/liar/...``)."""
    running = start_yard(
        tmp_path_factory.mktemp("yard"),
        APPS + echo_toml() + liar_toml() + FAST_LOST,
        server=f'admin_key = "{ADMIN_KEY}"',
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    """yard in the documented no-key demo mode (loopback only)."""
    running = start_yard(tmp_path_factory.mktemp("keyless"), echo_toml())
    try:
        yield running
    finally:
        running.stop()

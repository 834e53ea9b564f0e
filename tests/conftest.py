"""What every test shares: tests marked ``pure_core`` need the plain-Python core
(they replace a function of the core or subclass one of its classes, which the
compiled core does not see: :mod:`yard.compiled`), so they are skipped where the
compiled core runs; ``make test`` runs ``tests/core`` again with ``YARD_CORE=pure``."""

from __future__ import annotations

import pytest

from yard import compiled


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ok, why = compiled.ACTIVE
    if not ok:
        return
    skip = pytest.mark.skip(reason=f"needs the plain-Python core (YARD_CORE=pure); core: {why}")
    for item in items:
        if "pure_core" in item.keywords:
            item.add_marker(skip)

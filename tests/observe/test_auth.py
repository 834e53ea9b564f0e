from __future__ import annotations

import pytest

from yard.api.keys import bearer_key, is_loopback
from yard.observe.auth import check_admin


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:192.0.2.1", False),
        ("192.0.2.1", False),
        ("10.0.0.1", False),
        ("localhost", False),  # a name is not an address: refuse
        ("", False),
        (None, False),
    ],
)
def test_loopback_means_this_machine_only(address: str | None, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_bearer_key_reads_only_the_bearer_scheme() -> None:
    assert bearer_key("Bearer abc") == "abc"
    assert bearer_key("bearer  abc ") == "abc"
    assert bearer_key("Basic abc") is None
    assert bearer_key("Bearer ") is None
    assert bearer_key(None) is None


def _check(**changes: object) -> object:
    request: dict[str, object] = {
        "admin_key": "key",
        "method": "POST",
        "remote_addr": "192.0.2.1",
        "authorization": None,
        "session": False,
        "csrf_header": None,
    }
    request.update(changes)
    refusal = check_admin(**request)  # type: ignore[arg-type]
    return None if refusal is None else (refusal.status, refusal.code)


def test_who_may_act_as_admin() -> None:
    assert _check(authorization="Bearer key") is None
    assert _check(authorization="Bearer kex") == (401, "invalid_admin_key")
    assert _check() == (401, "invalid_admin_key")
    assert _check(remote_addr="127.0.0.1") == (401, "invalid_admin_key")
    assert _check(session=True, csrf_header="1") is None
    assert _check(session=True, method="GET") is None
    assert _check(session=True) == (403, "admin_header_required")
    assert _check(session=False, csrf_header="1") == (401, "invalid_admin_key")
    assert _check(admin_key=None, remote_addr="127.0.0.1") is None
    assert _check(admin_key=None, authorization="Bearer key") == (403, "admin_loopback_only")

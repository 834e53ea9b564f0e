"""Who may use the dashboard and the admin API.

Rules:

- With an admin key configured (``server.admin_key``), a request is admitted
  when it carries ``Authorization: Bearer KEY``, or the dashboard's cookie
  (set by its login form). The cookie holds an HMAC of the key, never the key.
- A state-changing request admitted by the cookie alone must also carry the
  ``X-Yard-Admin`` header: browsers do not let another site set it, so a
  foreign page cannot make a logged-in browser press the buttons (CSRF).
- With no admin key, only loopback clients are admitted.
- Keys are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

COOKIE = "yard_admin"
"""The dashboard's login cookie."""

CSRF_HEADER = "X-Yard-Admin"
"""Header the dashboard's script sends with every state-changing call."""

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request may not act as the admin: the HTTP status, a stable
    code and a message that says what to do."""

    status: int
    code: str
    message: str


def cookie_token(admin_key: str) -> str:
    """The cookie value that proves the browser was given the admin key."""
    return hmac.new(admin_key.encode(), b"yard dashboard login", hashlib.sha256).hexdigest()


def key_matches(given: str, admin_key: str) -> bool:
    """Whether ``given`` is the admin key (compared in constant time)."""
    return hmac.compare_digest(given.encode(), admin_key.encode())


def is_loopback(remote_addr: str | None) -> bool:
    """Whether the client address is on this machine (127.0.0.0/8, ::1)."""
    if not remote_addr:
        return False
    try:
        address = ipaddress.ip_address(remote_addr.split("%", 1)[0])
    except ValueError:
        return False
    # A dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header, if there is one."""
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


def check_admin(
    *,
    admin_key: str | None,
    method: str,
    remote_addr: str | None,
    authorization: str | None,
    cookie: str | None,
    csrf_header: str | None,
) -> Refusal | None:
    """Decide whether a request may act as the admin.

    Returns None when it may, otherwise why not: 403 ``admin_loopback_only``
    without a configured key, 401 ``invalid_admin_key`` for a missing or
    wrong key, 403 ``admin_header_required`` for a cookie-only state change.
    """
    if admin_key is None:
        if is_loopback(remote_addr):
            return None
        return Refusal(
            status=403,
            code="admin_loopback_only",
            message="the admin API answers loopback clients only while no admin key is "
            "configured; set server.admin_key in the configuration",
        )
    given = bearer_key(authorization)
    if given is not None:
        if key_matches(given, admin_key):
            return None
        return Refusal(status=401, code="invalid_admin_key", message="wrong admin key")
    if cookie is not None and hmac.compare_digest(
        cookie.encode(), cookie_token(admin_key).encode()
    ):
        if method.upper() in _SAFE_METHODS or csrf_header:
            return None
        return Refusal(
            status=403,
            code="admin_header_required",
            message=f"send the {CSRF_HEADER} header with state-changing dashboard calls",
        )
    return Refusal(
        status=401,
        code="invalid_admin_key",
        message="this needs the admin key: send Authorization: Bearer ADMIN_KEY",
    )

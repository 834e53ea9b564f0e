"""Who may use the dashboard and the admin API.

Rules:

- With an admin key configured (``server.admin_key``), a request is admitted
  when it carries ``Authorization: Bearer KEY``, or the cookie of a live
  dashboard session. A session is a random token handed out by the login form
  and held in memory (:class:`Sessions`): it expires
  (``server.dashboard_session_ttl_s``), logout revokes it, and a restart of
  yard logs everybody out. The cookie never holds the key or anything derived
  from it.
- Wrong admin keys (login form or bearer) are slowed down per client address
  (:class:`LoginThrottle`): after ``server.admin_failures_before_delay``
  failures each further one makes the client wait, twice as long each time,
  up to ``server.admin_failure_max_delay_s``; while it waits, every try is
  answered 429 with ``Retry-After`` and no key is checked. Behind a reverse
  proxy every client has the proxy's address, and so shares one record.
- A state-changing request admitted by the cookie alone must also carry the
  ``X-Yard-Admin`` header: browsers do not let another site set it, so a
  foreign page cannot make a logged-in browser press the buttons (CSRF).
- With no admin key, only loopback clients are admitted.
- Keys are compared in constant time.
"""

from __future__ import annotations

import hashlib
import math
import secrets

from yard.api.keys import bearer_key, is_loopback, key_matches
from yard.errors import Rejected

COOKIE = "yard_admin"
"""The dashboard's login cookie."""

CSRF_HEADER = "X-Yard-Admin"
"""Header the dashboard's script sends with every state-changing call."""

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


MAX_SESSIONS = 256
"""Most live dashboard sessions; a login past it ends the oldest one."""


def _digest(token: str) -> bytes:
    # Kept by hash: a dict look-up is not constant time, and a memory dump
    # holds no usable token.
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class Sessions:
    """The live dashboard sessions, in memory.

    ``now`` is any monotonic clock (yard passes ``trio.current_time()``).
    """

    def __init__(self, *, ttl_s: float, max_sessions: int = MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._expiry: dict[bytes, float] = {}

    def __len__(self) -> int:
        return len(self._expiry)

    def open(self, now: float) -> str:
        """A new session, live until ``now + ttl_s``: its token, for the cookie."""
        self._expiry = {d: t for d, t in self._expiry.items() if t >= now}
        while len(self._expiry) >= self.max_sessions:
            del self._expiry[min(self._expiry, key=self._expiry.__getitem__)]
        token = secrets.token_urlsafe(32)
        self._expiry[_digest(token)] = now + self.ttl_s
        return token

    def is_live(self, token: str | None, now: float) -> bool:
        """Whether ``token`` is a session that is live at ``now``."""
        if not token:
            return False
        digest = _digest(token)
        expiry = self._expiry.get(digest)
        if expiry is None:
            return False
        if now > expiry:
            del self._expiry[digest]
            return False
        return True

    def close(self, token: str | None) -> None:
        """End the session of ``token`` (logout); unknown tokens are ignored."""
        if token:
            self._expiry.pop(_digest(token), None)


def too_many_failures(wait_s: float) -> Rejected:
    """The answer to a client that must still wait after wrong keys."""
    return Rejected(
        status=429,
        code="too_many_failed_logins",
        message=f"too many wrong admin keys from this address; try again in "
        f"{max(1, math.ceil(wait_s))} s",
        retry_after_s=wait_s,
    )


def check_admin(
    *,
    admin_key: str | None,
    method: str,
    remote_addr: str | None,
    authorization: str | None,
    session: bool,
    csrf_header: str | None,
) -> Rejected | None:
    """Decide whether a request may act as the admin.

    Returns None when it may, otherwise why not: 403 ``admin_loopback_only``
    without a configured key, 401 ``invalid_admin_key`` for a missing or
    wrong key, 403 ``admin_header_required`` for a state change admitted by
    the session cookie alone. ``session``: the request carries the cookie of
    a live session.
    """
    if admin_key is None:
        if is_loopback(remote_addr):
            return None
        return Rejected(
            status=403,
            code="admin_loopback_only",
            message="the admin API answers loopback clients only while no admin key is "
            "configured; set server.admin_key in the configuration",
        )
    given = bearer_key(authorization)
    if given is not None:
        if key_matches(given, admin_key):
            return None
        return Rejected(status=401, code="invalid_admin_key", message="wrong admin key")
    if session:
        if method.upper() in _SAFE_METHODS or csrf_header:
            return None
        return Rejected(
            status=403,
            code="admin_header_required",
            message=f"send the {CSRF_HEADER} header with state-changing dashboard calls",
        )
    return Rejected(
        status=401,
        code="invalid_admin_key",
        message="this needs the admin key: send Authorization: Bearer ADMIN_KEY",
    )

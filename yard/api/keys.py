"""Who a request is: the one check of app keys and the admin key that every
route makes (the admin API and dashboard, ``/v1/jobs``, ``/v1/files``,
``/v1/batches``, ``/v1/announcements``).

Rules it keeps:

- The admin key is compared in constant time (:func:`key_matches`).
- Wrong keys are slowed down per client address by one
  :class:`LoginThrottle` that every route shares: after
  ``server.admin_failures_before_delay`` failures each further one makes the
  client wait, twice as long each time, up to
  ``server.admin_failure_max_delay_s``; while it waits, every key it sends is
  answered 429 with ``Retry-After`` and not checked at all. A guess is a
  guess on whichever route it is made.
- A right app key does not clear a client's failures (an app could otherwise
  guess the admin key between two of its own requests); a right admin key
  does.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import trio

from yard.api.intake import authenticate
from yard.config import AppConfig, Config, local_app
from yard.errors import Rejected

__all__ = ["KeyCheck", "LoginThrottle", "bearer_key", "client_key", "key_matches"]

MAX_CLIENTS = 4096
"""Most client addresses whose failed keys are remembered (the oldest is
forgotten first): a few hundred KiB at most."""


@dataclass(frozen=True, slots=True)
class _Failures:
    count: int
    waits_until: float


def client_key(remote_addr: str | None) -> str:
    """Whose failures these are: the IPv4 address, or the /64 of an IPv6 one
    (one host may hold a whole /64)."""
    if not remote_addr:
        return "unknown"
    try:
        address = ipaddress.ip_address(remote_addr.split("%", 1)[0])
    except ValueError:
        return remote_addr[:64]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class LoginThrottle:
    """Failed keys per client address, and how long each must wait.

    failures_before_delay: failures answered at once; the next one makes the
        client wait 1 s, then 2 s, 4 s, ... up to ``max_delay_s``.
    A client's record is forgotten ``max_delay_s`` after its wait ended with
    no new failure, or after a right key, or when ``max_clients`` newer
    records push it out.
    """

    def __init__(
        self,
        *,
        failures_before_delay: int,
        max_delay_s: float,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.failures_before_delay = failures_before_delay
        self.max_delay_s = max_delay_s
        self.max_clients = max_clients
        self._clients: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def wait_s(self, remote_addr: str | None, now: float) -> float:
        """How long this client must still wait before its key is checked."""
        record = self._clients.get(client_key(remote_addr))
        return 0.0 if record is None else max(0.0, record.waits_until - now)

    def failed(self, remote_addr: str | None, now: float) -> float:
        """Record a wrong key; returns the wait it imposes (0: none yet)."""
        key = client_key(remote_addr)
        record = self._clients.pop(key, None)
        count = 1
        if record is not None and now - record.waits_until <= self.max_delay_s:
            count = record.count + 1
        over = count - self.failures_before_delay
        delay = 0.0 if over <= 0 else min(self.max_delay_s, 2.0 ** min(over - 1, 62))
        self._clients[key] = _Failures(count=count, waits_until=now + delay)
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        return delay

    def succeeded(self, remote_addr: str | None) -> None:
        """A right key: forget this client's failures."""
        self._clients.pop(client_key(remote_addr), None)


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


def key_matches(given: str, admin_key: str) -> bool:
    """Whether ``given`` is the admin key (compared in constant time)."""
    return hmac.compare_digest(given.encode(), admin_key.encode())


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header, if there is one."""
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


class KeyCheck:
    """The key check of the routes that both apps and the admin use.

    config: the running configuration (its apps and ``server.admin_key``).
    throttle: the wrong-key throttle, shared with the dashboard's login and
        the admin API (one per running yard).
    clock: monotonic seconds, the throttle's (trio's clock by default).
    """

    def __init__(
        self,
        config: Config,
        *,
        throttle: LoginThrottle | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.config = config
        self.throttle = (
            LoginThrottle(
                failures_before_delay=config.server.admin_failures_before_delay,
                max_delay_s=config.server.admin_failure_max_delay_s,
            )
            if throttle is None
            else throttle
        )
        self._clock = clock

    def use_config(self, config: Config) -> None:
        """Check keys against ``config`` from now on (``yard reload``); the
        throttle keeps its records."""
        self.config = config

    def caller(self, authorization: str | None, remote_addr: str | None) -> AppConfig | None:
        """The app a request comes from, or None for the admin key.

        Raises :class:`~yard.errors.Rejected` 429 ``too_many_failed_logins``
        while the client must wait after wrong keys (no key is checked then),
        and the app-key refusals of :func:`yard.api.intake.authenticate` for
        a missing or unknown key (a wrong bearer key counts as a failure).
        """
        config = self.config
        admin_key = config.server.admin_key
        given = bearer_key(authorization)
        if admin_key is None or given is None:
            app, _ = authenticate(config, _encoded(authorization))
            return app
        now = self._clock()
        wait = self.throttle.wait_s(remote_addr, now)
        if wait > 0:
            if not config.apps:
                # Every request is the local app's, a key or not: a client
                # that must wait is answered as that app, its key unchecked.
                return local_app(config)
            raise Rejected(
                429,
                "too_many_failed_logins",
                f"too many wrong keys from this address; try again in {max(1, math.ceil(wait))} s",
                retry_after_s=wait,
            )
        if key_matches(given, admin_key):
            self.throttle.succeeded(remote_addr)
            return None
        if not config.apps:
            # A wrong admin key, or an OpenAI client's placeholder key: the
            # local app either way, but a guess all the same.
            self.throttle.failed(remote_addr, now)
            return local_app(config)
        known = config.app_for_key(given)
        if known is not None:
            return known
        delay = self.throttle.failed(remote_addr, now)
        try:
            authenticate(config, _encoded(authorization))
        except Rejected as refusal:
            if delay > 0:
                refusal.retry_after_s = delay
            raise
        raise AssertionError("authenticate accepted a key that belongs to no app")


def _encoded(authorization: str | None) -> bytes | None:
    return None if authorization is None else authorization.encode("latin-1")

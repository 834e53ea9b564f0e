"""The browser guard: ASGI middleware in front of the whole app.

A browser will send requests to yard on behalf of any web page its user
opens. Two attacks follow, and this module refuses both before any route
(data plane included) sees the request:

- **Cross-site request forgery.** A foreign page posts a form (or a
  ``fetch``) to ``http://127.0.0.1:8080/admin/backends/llm/unload`` or to
  ``/v1/chat/completions``. With no key configured nothing else stops it.
  Rule, in every mode: a request that changes state (any method but GET,
  HEAD and OPTIONS) and comes from a browser page of another origin is
  refused with 403 ``cross_origin_refused``. "From another origin" means its
  ``Origin`` header (which browsers add to every such request and pages
  cannot forge) names another scheme, host or port than the request's
  ``Host``, or is ``null``; or, without ``Origin``, its ``Sec-Fetch-Site``
  is ``cross-site`` or ``same-site``. ``server.allowed_origins`` lists pages
  that may (a browser app of your own, a TLS proxy that rewrites ``Host``).
  Programs (OpenAI clients, curl) send no ``Origin`` and pass.
- **DNS rebinding.** A foreign page makes its own name resolve to
  127.0.0.1 (or to yard's LAN address), and the browser then treats yard as
  that page's own origin: it may read every answer. Such requests carry the
  foreign name in ``Host``. Rule: the ``Host`` name (port ignored) must be
  one of ``server.allowed_hosts`` (403 ``host_not_allowed``) when yard
  listens on a loopback address, for every route; otherwise for the routes
  no key protects: the data plane (``/v1/...``, ``/backends/...``) while no
  app has a key, ``/admin`` and ``/dashboard`` while there is no admin key.
  Keyed routes need no such check (the page cannot know the key, and the
  dashboard's cookie is never sent to a foreign name), so a LAN user may
  reach a keyed yard by any name without listing it. ``/healthz`` and
  ``/metrics`` are public by design off loopback.

The default ``allowed_hosts``: ``localhost``, ``127.0.0.1``, ``::1`` and
the listen address; when yard listens on every address (``0.0.0.0``,
``::``) or on a LAN address, also this machine's host name (with and
without its domain, and as ``NAME.local``) and, for ``0.0.0.0``/``::``,
every address of its network interfaces (read once, at start). ``"*"``
turns the check off; ``".example.lan"`` allows that name and its
subdomains.

Cost on the hot path: one pass over the header list; a request without
``Origin`` or ``Sec-Fetch-Site`` and with a known ``Host`` pays a few dict
look-ups (measured in the commit that added this module).
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from yard.config import Config, is_loopback
from yard.h1.errors import error_body, error_headers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_READ_HEADERS = frozenset({b"host", b"origin", b"sec-fetch-site"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_FOREIGN_FETCH_SITES = frozenset({b"cross-site", b"same-site"})
_WILDCARD_LISTENS = frozenset({"0.0.0.0", "::", ""})
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_DEFAULT_PORTS = {b"http": b"80", b"https": b"443"}
_DATA_PLANE = ("/v1/", "/backends/")
_ADMIN_PLANE = ("/admin", "/dashboard")
_SEEN_LIMIT = 64
"""Most ``Host`` values remembered as allowed (only allowed ones are kept,
so foreign names cannot grow it)."""


def host_name(host: bytes) -> str:
    """The name in a ``Host`` header, without port, brackets or a final dot,
    lowercased: ``b"[::1]:8080"`` -> ``"::1"``, ``b"Yard.LAN.:80"`` -> ``"yard.lan"``."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        name = text[1:].partition("]")[0]
    else:
        name = text.rpartition(":")[0] if text.count(":") == 1 else text
    return name.rstrip(".")


def _authority(value: bytes) -> tuple[bytes, bytes | None]:
    """``b"host:port"`` / ``b"[v6]:port"`` / ``b"host"`` -> (host, port or None)."""
    value = value.strip().lower()
    if value.startswith(b"["):
        name, _, rest = value[1:].partition(b"]")
        return name, rest[1:] if rest.startswith(b":") and len(rest) > 1 else None
    if value.count(b":") == 1:
        name, _, port = value.partition(b":")
        return name, port or None
    return value, None


def _parse_origin(origin: bytes) -> tuple[bytes, bytes, bytes] | None:
    """``b"https://Yard.lan:8443"`` -> ``(b"https", b"yard.lan", b"8443")``, the
    scheme's default port filled in; None if it is not an http(s) origin."""
    scheme, sep, rest = origin.strip().lower().partition(b"://")
    default = _DEFAULT_PORTS.get(scheme)
    if not sep or default is None or not rest or any(c in rest for c in b"/?#@"):
        return None
    name, port = _authority(rest)
    if not name or (port is not None and not port.isdigit()):
        return None
    return scheme, name, port or default


def normalize_origin(origin: str | bytes) -> bytes | None:
    """An origin as ``scheme://host:port``, lowercased, the port always
    written; None if it is not an http(s) origin."""
    parsed = _parse_origin(origin.encode("latin-1") if isinstance(origin, str) else origin)
    if parsed is None:
        return None
    scheme, name, port = parsed
    return b"%s://%s:%s" % (scheme, b"[%s]" % name if b":" in name else name, port)


def origin_matches_host(origin: bytes, host: bytes | None) -> bool:
    """Whether the page at ``origin`` is the server the ``Host`` header names
    (same host and port; a ``Host`` without a port means the scheme's default)."""
    parsed = _parse_origin(origin)
    if parsed is None or host is None:
        return False
    scheme, name, port = parsed
    host_name_, host_port = _authority(host)
    return name == host_name_ and port == (host_port or _DEFAULT_PORTS[scheme])


def _machine_names() -> set[str]:
    """This machine's host name, its first label and ``LABEL.local`` (mDNS)."""
    names = set()
    hostname = socket.gethostname().strip().lower().rstrip(".")
    if hostname:
        first = hostname.partition(".")[0]
        names |= {hostname, first, f"{first}.local"}
    return names


def _interface_addresses() -> set[str]:
    """Every address of this machine's network interfaces."""
    import psutil  # only when yard listens on every address

    found = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                found.add(address.address.partition("%")[0].lower())
    return found


def default_allowed_hosts(listen_host: str) -> frozenset[str]:
    """The names a client of yard listening on ``listen_host`` uses (see the
    module docstring)."""
    names = set(_LOOPBACK_NAMES)
    listen = listen_host.strip("[]").lower()
    if listen not in _WILDCARD_LISTENS:
        names.add(listen)
    if not is_loopback(listen):
        names |= _machine_names()
    if listen in _WILDCARD_LISTENS:
        names |= _interface_addresses()
    return frozenset(names)


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardPolicy:
    """What the guard allows.

    allowed_hosts: ``Host`` names accepted where the name is checked; ``"*"``
        in it turns the check off, ``".example.lan"`` allows a domain and its
        subdomains.
    allowed_origins: pages of another origin that may change state
        (normalized by :func:`normalize_origin`).
    check_all: check ``Host`` on every route (yard listens on loopback).
    data_plane_keyless: no app has a key (the data plane is open).
    admin_keyless: no admin key (admin and dashboard are open to loopback).
    """

    allowed_hosts: frozenset[str]
    allowed_origins: frozenset[bytes] = frozenset()
    check_all: bool = True
    data_plane_keyless: bool = True
    admin_keyless: bool = True

    @classmethod
    def from_config(cls, config: Config) -> GuardPolicy:
        """The policy for ``config`` (``server.allowed_hosts`` or its default,
        ``server.allowed_origins``, the listen address and which keys exist)."""
        server = config.server
        hosts: Iterable[str] = (
            server.allowed_hosts
            if server.allowed_hosts is not None
            else default_allowed_hosts(server.listen_host)
        )
        origins = (normalize_origin(origin) for origin in server.allowed_origins)
        return cls(
            allowed_hosts=frozenset(h.strip("[]").lower().rstrip(".") for h in hosts),
            allowed_origins=frozenset(o for o in origins if o is not None),
            check_all=is_loopback(server.listen_host.strip("[]")),
            data_plane_keyless=not config.apps,
            admin_keyless=server.admin_key is None,
        )


class Guard:
    """ASGI middleware: refuses cross-origin state changes and requests for
    foreign ``Host`` names (see the module docstring), passes everything else
    to ``app`` untouched. Non-HTTP scopes (lifespan) pass straight through."""

    def __init__(self, app: ASGIApp, policy: GuardPolicy) -> None:
        self.app = app
        self.policy = policy
        self._any_host = "*" in policy.allowed_hosts
        self._suffixes = tuple(h for h in policy.allowed_hosts if h.startswith("."))
        # Which paths need the Host check when check_all is off.
        prefixes: tuple[str, ...] = ()
        if policy.data_plane_keyless:
            prefixes += _DATA_PLANE
        if policy.admin_keyless:
            prefixes += _ADMIN_PLANE
        self._keyless_prefixes = prefixes
        self._host_check_off = self._any_host or not (policy.check_all or prefixes)
        self._seen: dict[bytes, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = origin = fetch_site = None
            for name, value in scope["headers"]:
                # One set look-up per header: the cheap path for the many
                # headers this guard does not read.
                if name in _READ_HEADERS:
                    if name == b"host":
                        host = value
                    elif name == b"origin":
                        origin = value
                    else:
                        fetch_site = value
            # A Host seen before and allowed, no browser headers: pass at once.
            if (
                not (self._host_check_off or host is None or self._seen.get(host))
                or origin
                or fetch_site
            ):
                refusal = self._check_host(scope, host)
                if refusal is None and (origin is not None or fetch_site is not None):
                    refusal = self._check_origin(scope, host, origin, fetch_site)
                if refusal is not None:
                    return await _refuse(send, *refusal)
        await self.app(scope, receive, send)

    def _check_host(self, scope: Scope, host: bytes | None) -> tuple[str, str] | None:
        if host is None or self._host_check_off or self._seen.get(host):
            # No Host: an HTTP/1.0 program (every browser sends one).
            return None
        if not self.policy.check_all and not scope["path"].startswith(self._keyless_prefixes):
            return None
        name = host_name(host)
        if name in self.policy.allowed_hosts or any(
            name == suffix[1:] or name.endswith(suffix) for suffix in self._suffixes
        ):
            if len(self._seen) < _SEEN_LIMIT:
                self._seen[host] = True
            return None
        shown = name[:100]
        return (
            "host_not_allowed",
            f"this yard does not answer to the name {shown!r} (a guard against DNS "
            "rebinding); reach it by an address such as 127.0.0.1, or add the name to "
            "server.allowed_hosts in yard's configuration",
        )

    def _check_origin(
        self, scope: Scope, host: bytes | None, origin: bytes | None, fetch_site: bytes | None
    ) -> tuple[str, str] | None:
        if scope["method"] in _SAFE_METHODS:
            return None
        if origin is not None:
            if origin_matches_host(origin, host):
                return None
            if normalize_origin(origin) in self.policy.allowed_origins:
                return None
            page = origin.decode("latin-1")[:100]
        elif fetch_site is not None and fetch_site.strip().lower() in _FOREIGN_FETCH_SITES:
            page = "another site"
        else:
            return None
        return (
            "cross_origin_refused",
            f"a web page from {page!r} may not change anything in yard (a guard against "
            "cross-site request forgery); use yard's own dashboard or a program that sends "
            "no Origin header, or list that page's origin in server.allowed_origins",
        )


async def _refuse(send: Send, code: str, message: str) -> None:
    body = error_body(403, code, message)
    headers = error_headers(body, None)
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def guard(app: ASGIApp, config: Config) -> Guard:
    """``app`` behind the browser guard configured by ``config``."""
    return Guard(app, GuardPolicy.from_config(config))

"""``[server]``: how yard itself runs (:class:`ServerConfig`) and its reader."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yard.config.reading import (
    LOG_LEVELS,
    _kind,
    _non_empty,
    _non_negative,
    _path,
    _positive,
    _Reader,
    parse_listen,
)
from yard.core.spec import SchedulerConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """``[server]``: how yard itself runs.

    listen_host, listen_port: where the HTTP gateway listens.
    data_dir: jobs, profiles, backend logs and pid files (absolute).
    admin_key: guards the admin API; None: no admin key (admin API from
        loopback only).
    max_body_bytes: largest request body accepted (413 above).
    default_priority: priority of requests from apps without their own default.
    stop_grace_s: default time between SIGTERM and SIGKILL for backends, and
        the grace given to in-flight requests at shutdown.
    log_level: yard's own log level.
    allow_anonymous: off loopback, let the data plane take requests without
        an app key (only when no app has one; the admin API still needs the
        admin key). False: such a configuration is refused.
    allowed_hosts: ``Host`` names yard answers to where the browser guard
        checks them (:mod:`yard.http.guard`); None: the default for the
        listen address.
    allowed_origins: web pages of another origin that may send state-changing
        requests (``scheme://host[:port]``).
    dashboard_session_ttl_s: how long a dashboard login lasts.
    dashboard_login_max_bytes: largest login form body (413 above).
    admin_failures_before_delay: wrong admin keys a client may send before it
        must wait between tries.
    admin_failure_max_delay_s: longest such wait (it doubles per failure).
    keep_alive_s: how long a client connection may stay idle between requests.
    head_timeout_s: how long a request head may take to arrive (from the
        connection's start, or a later head's first byte); then 408.
    body_timeout_s: how long a request body may go without a byte; then 408.
    send_timeout_s: how long a client may take none of its answer before the
        request ends as cancelled (as if it had hung up).
    max_connections: client connections served at once (lowered at start
        to fit the open-file limit); at it, the connection waiting longest on
        its client makes room, and when none waits only ``/healthz`` and the
        admin key are served.
    reserved_connections: connections over ``max_connections`` kept for
        ``/healthz`` and the admin key; past them a connection gets 503.
    """

    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    data_dir: Path = Path("data")
    admin_key: str | None = None
    max_body_bytes: int = 64 * 2**20
    default_priority: float = 50.0
    stop_grace_s: float = 10.0
    log_level: str = "info"
    allow_anonymous: bool = False
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()
    dashboard_session_ttl_s: float = 12 * 3600.0
    dashboard_login_max_bytes: int = 4096
    admin_failures_before_delay: int = 5
    admin_failure_max_delay_s: float = 300.0
    keep_alive_s: float = 75.0
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    max_connections: int = 1000
    reserved_connections: int = 8


SERVER_KEYS = (
    "listen",
    "data_dir",
    "admin_key",
    "admin_key_env",
    "max_body_bytes",
    "default_priority",
    "stop_grace_s",
    "log_level",
    "allow_anonymous",
    "allowed_hosts",
    "allowed_origins",
    "dashboard_session_ttl_s",
    "dashboard_login_max_bytes",
    "admin_failures_before_delay",
    "admin_failure_max_delay_s",
    "keep_alive_s",
    "head_timeout_s",
    "body_timeout_s",
    "send_timeout_s",
    "max_connections",
    "reserved_connections",
)


def _server(r: _Reader, data: dict[str, Any], scheduler: SchedulerConfig) -> ServerConfig:
    r.known(data, "server", SERVER_KEYS)
    defaults = ServerConfig()
    host, port = defaults.listen_host, defaults.listen_port
    listen = r.get(data, "server", "listen", str, "")
    if listen:
        try:
            host, port = parse_listen(listen)
        except ValueError as exc:
            r.error("server.listen", str(exc))
    data_dir_text = r.get(data, "server", "data_dir", str, str(defaults.data_dir), _non_empty)
    data_dir = _path(r, "server.data_dir", data_dir_text, None) or r.path.parent / "data"
    default_priority = r.get(data, "server", "default_priority", float, defaults.default_priority)
    if not scheduler.min_priority <= default_priority <= scheduler.max_priority:
        r.error(
            "server.default_priority",
            f"{default_priority} is outside the scheduler's range "
            f"[{scheduler.min_priority}, {scheduler.max_priority}]",
        )
    max_body = r.size(data, "server", "max_body_bytes", defaults.max_body_bytes)
    if "max_body_bytes" in data and max_body == 0:
        r.error("server.max_body_bytes", "must be greater than 0")
    level = r.get(data, "server", "log_level", str, defaults.log_level).lower()
    if level not in LOG_LEVELS:
        r.error("server.log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        level = defaults.log_level
    return ServerConfig(
        listen_host=host,
        listen_port=port,
        data_dir=data_dir,
        admin_key=r.secret(data, "server", "admin_key", "admin_key_env"),
        max_body_bytes=max_body,
        default_priority=default_priority,
        stop_grace_s=r.get(
            data, "server", "stop_grace_s", float, defaults.stop_grace_s, _non_negative
        ),
        log_level=level,
        allow_anonymous=r.get(data, "server", "allow_anonymous", bool, False),
        allowed_hosts=_allowed_hosts(r, data),
        allowed_origins=_allowed_origins(r, data),
        dashboard_session_ttl_s=r.get(
            data, "server", "dashboard_session_ttl_s", float, 12 * 3600.0, _positive
        ),
        dashboard_login_max_bytes=_login_max_bytes(r, data),
        admin_failures_before_delay=r.get(
            data, "server", "admin_failures_before_delay", int, 5, _non_negative
        ),
        admin_failure_max_delay_s=r.get(
            data, "server", "admin_failure_max_delay_s", float, 300.0, _positive
        ),
        keep_alive_s=r.get(data, "server", "keep_alive_s", float, defaults.keep_alive_s, _positive),
        head_timeout_s=r.get(
            data, "server", "head_timeout_s", float, defaults.head_timeout_s, _positive
        ),
        body_timeout_s=r.get(
            data, "server", "body_timeout_s", float, defaults.body_timeout_s, _positive
        ),
        send_timeout_s=r.get(
            data, "server", "send_timeout_s", float, defaults.send_timeout_s, _positive
        ),
        max_connections=r.get(
            data, "server", "max_connections", int, defaults.max_connections, _positive
        ),
        reserved_connections=r.get(
            data,
            "server",
            "reserved_connections",
            int,
            defaults.reserved_connections,
            _non_negative,
        ),
    )


def _strings(r: _Reader, data: dict[str, Any], name: str) -> list[str] | None:
    """``server.NAME`` as a list of non-empty strings; None if absent or wrong."""
    if name not in data:
        return None
    value = data[name]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        r.error(f"server.{name}", f"must be a list of non-empty strings, got {_kind(value)}")
        return None
    return [v.strip().lower() for v in value]


def _allowed_hosts(r: _Reader, data: dict[str, Any]) -> tuple[str, ...] | None:
    hosts = _strings(r, data, "allowed_hosts")
    if hosts is None:
        return None
    for host in hosts:
        if host != "*" and any(c in host for c in "/:@ ") and not _is_ip(host.strip("[]")):
            r.error(
                "server.allowed_hosts",
                f"{host!r} is not a host name: give names or addresses without scheme or "
                'port, such as "yard.lan" or "192.168.1.10" (".yard.lan" for subdomains too, '
                '"*" for any)',
            )
    return tuple(host.strip("[]").rstrip(".") for host in hosts)


def _allowed_origins(r: _Reader, data: dict[str, Any]) -> tuple[str, ...]:
    origins = _strings(r, data, "allowed_origins") or []
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if scheme not in ("http", "https") or not sep or not rest or any(c in rest for c in "/?#@"):
            r.error(
                "server.allowed_origins",
                f"{origin!r} is not an origin: write scheme://host[:port] with no path, such "
                'as "https://chat.example.lan"',
            )
    return tuple(origins)


def _login_max_bytes(r: _Reader, data: dict[str, Any]) -> int:
    size = r.size(data, "server", "dashboard_login_max_bytes", 4096)
    if size <= 0:
        r.error("server.dashboard_login_max_bytes", "must be greater than 0")
    return size


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True

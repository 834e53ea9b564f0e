"""The browser guard (yard.http.guard): cross-site state changes and DNS
rebinding are refused before any route runs, programs pass untouched."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import trio

from yard.app.web import Parts, create_app, serve_app
from yard.config import AppConfig, BackendConfig, Config, ConfigError, ServerConfig, load_config
from yard.core.spec import SchedulerConfig
from yard.engine import Engine
from yard.http.guard import (
    Guard,
    GuardPolicy,
    default_allowed_hosts,
    host_name,
    normalize_origin,
    origin_matches_host,
)
from yard.testing.engine import FakeEngine

FORM = "application/x-www-form-urlencoded"
EVIL = "http://evil.example"


def make_config(
    *,
    listen_host: str = "127.0.0.1",
    admin_key: str | None = None,
    apps: dict[str, AppConfig] | None = None,
    **server: Any,
) -> Config:
    return Config(
        path=Path("/nonexistent/yard.toml"),
        server=ServerConfig(listen_host=listen_host, admin_key=admin_key, **server),
        scheduler=SchedulerConfig(),
        devices={},
        apps=apps or {},
        backends={"llm": BackendConfig(name="llm", models=("tiny",), command=("true",))},
    )


@pytest.fixture
async def keyless_yard() -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine]]:
    """The documented no-key demo: the whole app on a loopback port."""
    engine = FakeEngine()
    engine.set_backend("llm", state="ready")
    parts = Parts(config=make_config(), engine=cast(Engine, engine), started_at=1.0)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve_app, create_app(parts), "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=binds[0], timeout=10.0) as client:
            yield client, engine
        nursery.cancel_scope.cancel()
    parts.pool.close_idle()


async def test_a_cross_site_form_cannot_unload_a_backend_in_keyless_mode(
    keyless_yard: tuple[httpx.AsyncClient, FakeEngine],
) -> None:
    client, engine = keyless_yard
    with trio.fail_after(10):
        forged = await client.post(
            "/admin/backends/llm/unload",
            content=b"x=1",
            headers={"Origin": EVIL, "Content-Type": FORM},
        )
    assert forged.status_code == 403
    error = forged.json()["error"]
    assert error["code"] == "cross_origin_refused"
    assert error["type"] == "permission_error"
    assert "server.allowed_origins" in error["message"]
    assert engine.sent == []


async def test_a_cross_site_form_cannot_spend_gpu_time_in_keyless_mode(
    keyless_yard: tuple[httpx.AsyncClient, FakeEngine],
) -> None:
    client, _ = keyless_yard
    with trio.fail_after(10):
        forged = await client.post(
            "/v1/chat/completions",
            content=b'{"model": "tiny"}',
            headers={"Origin": EVIL, "Content-Type": "text/plain"},
        )
    assert forged.status_code == 403
    assert forged.json()["error"]["code"] == "cross_origin_refused"


@pytest.mark.parametrize("path", ["/admin/status", "/v1/jobs", "/dashboard", "/healthz"])
async def test_a_rebound_dns_name_gets_nothing_from_a_loopback_yard(
    keyless_yard: tuple[httpx.AsyncClient, FakeEngine], path: str
) -> None:
    client, _ = keyless_yard
    with trio.fail_after(10):
        rebound = await client.get(path, headers={"Host": "rebind.attacker.example:8080"})
    assert rebound.status_code == 403
    error = rebound.json()["error"]
    assert error["code"] == "host_not_allowed"
    assert "server.allowed_hosts" in error["message"]


async def test_the_same_origin_and_programs_without_origin_pass(
    keyless_yard: tuple[httpx.AsyncClient, FakeEngine],
) -> None:
    client, engine = keyless_yard
    own = str(client.base_url).rstrip("/")
    with trio.fail_after(10):
        page = await client.post(
            "/admin/backends/llm/unload", headers={"Origin": own, "X-Yard-Admin": "1"}
        )
        program = await client.post("/admin/backends/llm/pin")
        status = await client.get("/admin/status", headers={"Host": "localhost"})
    assert page.status_code == 202
    assert program.status_code == 202
    assert status.status_code == 200
    assert len(engine.sent) == 2


# -- the rules, on the guard alone ---------------------------------------------


class Recorder:
    """An ASGI app that answers 200 and counts the requests it saw."""

    def __init__(self) -> None:
        self.seen = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def call(
    guard: Guard, method: str, path: str, headers: dict[str, str]
) -> tuple[int, str | None]:
    """One request through ``guard``: the status and the error code, if any."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    await guard(scope, receive, send)
    body = sent[1]["body"]
    return sent[0]["status"], json.loads(body)["error"]["code"] if body else None


def make_guard(config: Config, **changes: Any) -> tuple[Guard, Recorder]:
    inner = Recorder()
    policy = dataclasses.replace(GuardPolicy.from_config(config), **changes)
    return Guard(inner, policy), inner


async def test_foreign_browser_state_changes_are_refused_in_every_mode() -> None:
    modes = [
        make_config(),
        make_config(admin_key="admin"),
        make_config(
            listen_host="0.0.0.0",
            admin_key="admin",
            apps={"a": AppConfig(name="a", key="k", default_priority=50, max_priority=90)},
        ),
    ]
    for config in modes:
        guard, inner = make_guard(config)
        host = {"Host": "127.0.0.1:8080"}
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            for path in ("/v1/chat/completions", "/admin/backends/llm/load", "/dashboard/login"):
                assert await call(guard, method, path, {**host, "Origin": EVIL}) == (
                    403,
                    "cross_origin_refused",
                )
        assert await call(guard, "POST", "/v1/x", {**host, "Origin": "null"}) == (
            403,
            "cross_origin_refused",
        )
        for site in ("cross-site", "same-site"):
            assert await call(guard, "POST", "/v1/x", {**host, "Sec-Fetch-Site": site}) == (
                403,
                "cross_origin_refused",
            )
        # Another port of the same machine is another origin.
        other_port = {**host, "Origin": "http://127.0.0.1:3000"}
        assert (await call(guard, "POST", "/v1/x", other_port))[0] == 403
        assert inner.seen == 0
        # Reading is no state change (and CORS keeps the answer from the page).
        assert await call(guard, "GET", "/v1/models", {**host, "Origin": EVIL}) == (200, None)
        for site in ("same-origin", "none"):
            assert await call(guard, "POST", "/v1/x", {**host, "Sec-Fetch-Site": site}) == (
                200,
                None,
            )


async def test_a_listed_origin_may_change_state() -> None:
    config = make_config(allowed_origins=("https://chat.example.lan",))
    guard, _ = make_guard(config)
    headers = {"Host": "127.0.0.1:8080", "Origin": "https://chat.example.lan"}
    assert await call(guard, "POST", "/v1/chat/completions", headers) == (200, None)
    headers["Origin"] = "https://chat.example.lan:444"
    assert (await call(guard, "POST", "/v1/chat/completions", headers))[0] == 403


async def test_behind_a_tls_proxy_the_origin_matches_a_host_without_port() -> None:
    guard, _ = make_guard(make_config(), allowed_hosts=frozenset({"yard.example"}))
    headers = {"Host": "yard.example", "Origin": "https://yard.example"}
    assert await call(guard, "POST", "/dashboard/login", headers) == (200, None)
    # A Host without a port means the default port of the origin's scheme.
    headers["Origin"] = "http://yard.example"
    assert await call(guard, "POST", "/dashboard/login", headers) == (200, None)
    headers["Host"] = "yard.example:8443"
    assert (await call(guard, "POST", "/dashboard/login", headers))[0] == 403


async def test_off_loopback_only_keyless_routes_check_the_host_name() -> None:
    # An admin key but no app keys: the data plane is open, admin is keyed.
    config = make_config(listen_host="0.0.0.0", admin_key="admin")
    guard, _ = make_guard(config)
    lan_name = {"Host": "gpubox.home.arpa:8080"}
    assert await call(guard, "GET", "/v1/jobs", lan_name) == (403, "host_not_allowed")
    assert await call(guard, "POST", "/backends/llm/x", lan_name) == (403, "host_not_allowed")
    assert await call(guard, "GET", "/admin/status", lan_name) == (200, None)
    assert await call(guard, "GET", "/metrics", lan_name) == (200, None)
    # With app keys too, a LAN user may use any name.
    keyed = dataclasses.replace(
        config, apps={"a": AppConfig(name="a", key="k", default_priority=50, max_priority=90)}
    )
    guard, _ = make_guard(keyed)
    assert await call(guard, "GET", "/v1/jobs", lan_name) == (200, None)
    # The machine's own name works without listing it.
    own = {"Host": f"{socket.gethostname()}:8080"}
    guard, _ = make_guard(config)
    assert await call(guard, "GET", "/v1/jobs", own) == (200, None)


async def test_a_loopback_listen_checks_the_host_name_on_every_route() -> None:
    guard, _ = make_guard(make_config(admin_key="admin"))
    for path in ("/admin/status", "/metrics", "/healthz", "/v1/models"):
        assert await call(guard, "GET", path, {"Host": "evil.example"}) == (
            403,
            "host_not_allowed",
        )
    for host in ("127.0.0.1:8080", "localhost:8080", "LOCALHOST.", "[::1]:8080", "[::1]"):
        assert await call(guard, "GET", "/healthz", {"Host": host}) == (200, None)
    # An HTTP/1.0 program sends no Host at all.
    assert await call(guard, "GET", "/healthz", {}) == (200, None)


async def test_allowed_hosts_take_a_domain_suffix_or_a_star() -> None:
    guard, _ = make_guard(make_config(), allowed_hosts=frozenset({".yard.lan"}))
    assert await call(guard, "GET", "/v1/jobs", {"Host": "yard.lan"}) == (200, None)
    assert await call(guard, "GET", "/v1/jobs", {"Host": "gpu.yard.lan:8080"}) == (200, None)
    assert (await call(guard, "GET", "/v1/jobs", {"Host": "notyard.lan"}))[0] == 403
    assert (await call(guard, "GET", "/v1/jobs", {"Host": "127.0.0.1"}))[0] == 403
    guard, _ = make_guard(make_config(), allowed_hosts=frozenset({"*"}))
    assert await call(guard, "GET", "/v1/jobs", {"Host": "anything"}) == (200, None)


async def test_lifespan_passes_through() -> None:
    inner_scopes: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        inner_scopes.append(scope["type"])

    guard = Guard(inner, GuardPolicy.from_config(make_config()))
    await guard({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert inner_scopes == ["lifespan"]


def test_default_names_follow_the_listen_address() -> None:
    loopback = default_allowed_hosts("127.0.0.1")
    assert loopback == {"localhost", "127.0.0.1", "::1"}
    assert "::1" in default_allowed_hosts("[::1]")
    everywhere = default_allowed_hosts("0.0.0.0")
    assert socket.gethostname().lower() in everywhere
    assert loopback < everywhere
    lan = default_allowed_hosts("192.0.2.10")
    assert "192.0.2.10" in lan
    assert socket.gethostname().lower() in lan


def test_names_and_origins_are_compared_normalized() -> None:
    assert host_name(b"[::1]:8080") == "::1"
    assert host_name(b"Yard.LAN.:80") == "yard.lan"
    assert host_name(b"localhost") == "localhost"
    assert normalize_origin("HTTPS://Chat.Example") == b"https://chat.example:443"
    assert normalize_origin("http://[::1]:8080") == b"http://[::1]:8080"
    assert normalize_origin("null") is None
    assert normalize_origin("http://a.example/path") is None
    assert origin_matches_host(b"http://127.0.0.1:8080", b"127.0.0.1:8080")
    assert origin_matches_host(b"http://[::1]:8080", b"[::1]:8080")
    assert origin_matches_host(b"http://yard.lan", b"YARD.lan:80")
    assert not origin_matches_host(b"http://yard.lan", None)
    assert not origin_matches_host(b"http://yard.lan.evil", b"yard.lan")


def _load(tmp_path: Path, server: str) -> Config:
    path = tmp_path / "yard.toml"
    path.write_text(f"[server]\n{server}\n")
    return load_config(path, env={})


def test_guard_keys_are_read_and_checked(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        'allowed_hosts = ["Yard.LAN", "[::1]", ".home.arpa"]\n'
        'allowed_origins = ["https://chat.example.lan"]',
    )
    assert config.server.allowed_hosts == ("yard.lan", "::1", ".home.arpa")
    assert config.server.allowed_origins == ("https://chat.example.lan",)
    assert _load(tmp_path, "").server.allowed_hosts is None
    with pytest.raises(ConfigError) as bad:
        _load(
            tmp_path,
            'allowed_hosts = ["yard.lan:8080", "http://x"]\n'
            'allowed_origins = ["chat.example.lan", "https://a.example/path"]',
        )
    messages = "\n".join(bad.value.errors)
    assert messages.count("server.allowed_hosts") == 2
    assert messages.count("server.allowed_origins") == 2
    with pytest.raises(ConfigError, match=r"server\.allowed_hosts: must be a list"):
        _load(tmp_path, 'allowed_hosts = "yard.lan"')

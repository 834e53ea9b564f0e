"""Dashboard logins: random server-side sessions that expire and that logout
revokes, failed admin keys slowed down per client, a small login body."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import trio
from quart_trio import QuartTrio

from tests.observe.conftest import ADMIN_KEY, REMOTE
from yard.api.keys import LoginThrottle
from yard.config import ConfigError, load_config
from yard.observe import Observer, auth, install
from yard.testing.engine import FakeEngine

OTHER = {"client": ("192.0.2.99", 40000)}


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_app(engine: FakeEngine, clock: Clock, **settings: object) -> QuartTrio:
    app = QuartTrio(__name__)
    install(app, Observer(engine=engine, admin_key=ADMIN_KEY, clock=clock, **settings))  # type: ignore[arg-type]
    return app


async def _login(
    app: QuartTrio, key: str = ADMIN_KEY, scope: dict[str, tuple[str, int]] = REMOTE
) -> str:
    """Log in as a browser would; the session cookie's value."""
    response = await app.test_client().post("/dashboard/login", form={"key": key}, scope_base=scope)
    assert response.status_code == 303
    cookie = response.headers["Set-Cookie"]
    return cookie.split(";", 1)[0].split("=", 1)[1]


async def _page(app: QuartTrio, token: str) -> int:
    client = app.test_client()
    client.set_cookie("localhost", auth.COOKIE, token)
    return (await client.get("/dashboard", scope_base=REMOTE)).status_code


async def test_each_login_gets_a_new_random_session_with_strict_cookie_flags(
    engine: FakeEngine,
) -> None:
    app = make_app(engine, Clock(), session_ttl_s=600.0)
    response = await app.test_client().post(
        "/dashboard/login", form={"key": ADMIN_KEY}, scope_base=REMOTE
    )
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Path=/" in cookie
    assert "Max-Age=600" in cookie
    first = cookie.split(";", 1)[0].split("=", 1)[1]
    second = await _login(app)
    assert first != second
    assert len(first) >= 40
    assert ADMIN_KEY not in first
    assert await _page(app, first) == 200
    assert await _page(app, second) == 200
    # A value the server never handed out is no session.
    assert await _page(app, first[:-2] + "xx") == 401


async def test_a_session_expires_after_its_ttl(engine: FakeEngine) -> None:
    clock = Clock()
    app = make_app(engine, clock, session_ttl_s=600.0)
    token = await _login(app)
    clock.now += 599
    assert await _page(app, token) == 200
    clock.now += 2
    assert await _page(app, token) == 401
    client = app.test_client()
    client.set_cookie("localhost", auth.COOKIE, token)
    page = await client.get("/dashboard", scope_base=REMOTE)
    assert "expired" in await page.get_data(as_text=True)


async def test_logout_revokes_the_session_on_the_server(engine: FakeEngine) -> None:
    app = make_app(engine, Clock())
    token = await _login(app)
    client = app.test_client()
    client.set_cookie("localhost", auth.COOKIE, token)
    out = await client.post("/dashboard/logout", scope_base=REMOTE)
    assert out.status_code == 303
    # A copy of the cookie kept elsewhere is worthless now.
    assert await _page(app, token) == 401
    replay = app.test_client()
    replay.set_cookie("localhost", auth.COOKIE, token)
    pressed = await replay.post(
        "/admin/backends/llm/unload", headers={auth.CSRF_HEADER: "1"}, scope_base=REMOTE
    )
    assert pressed.status_code == 401
    assert engine.sent == []


async def test_a_login_from_an_https_page_gets_a_secure_cookie_behind_a_tls_proxy(
    engine: FakeEngine,
) -> None:
    # yard itself speaks plain HTTP; behind a TLS proxy the browser's Origin
    # says the page is https, so the cookie must never travel in clear text.
    app = make_app(engine, Clock())
    behind = await app.test_client().post(
        "/dashboard/login",
        form={"key": ADMIN_KEY},
        headers={"Origin": "https://yard.example.lan"},
        scope_base=REMOTE,
    )
    assert "Secure" in behind.headers["Set-Cookie"]
    plain = await app.test_client().post(
        "/dashboard/login",
        form={"key": ADMIN_KEY},
        headers={"Origin": "http://127.0.0.1:8080"},
        scope_base=REMOTE,
    )
    assert "Secure" not in plain.headers["Set-Cookie"]


async def test_failed_logins_are_slowed_down_per_client(engine: FakeEngine) -> None:
    clock = Clock()
    app = make_app(engine, clock, failures_before_delay=5, failure_max_delay_s=300.0)
    client = app.test_client()

    async def guess(
        key: str = "wrong", scope: dict[str, tuple[str, int]] = REMOTE
    ) -> tuple[int, str]:
        answer = await client.post("/dashboard/login", form={"key": key}, scope_base=scope)
        return answer.status_code, answer.headers.get("Retry-After", "")

    for _ in range(5):
        assert await guess() == (401, "")
    assert await guess() == (401, "1")  # the sixth: wait a second
    # While it waits, nothing is checked, not even the right key.
    assert await guess(ADMIN_KEY) == (429, "1")
    answered = [await guess() for _ in range(200)]
    assert answered == [(429, "1")] * 200
    # Another client is not held up.
    assert (await guess(ADMIN_KEY, OTHER))[0] == 303
    clock.now += 1
    assert await guess() == (401, "2")  # each failure doubles the wait
    clock.now += 2
    assert await guess() == (401, "4")
    for _ in range(20):
        clock.now += 300
        await guess()
    clock.now += 299
    assert await guess() == (429, "1")
    clock.now += 1
    # Capped; the right key, once let through, clears the record.
    assert (await guess(ADMIN_KEY))[0] == 303
    assert await guess() == (401, "")


async def test_wrong_bearer_keys_are_slowed_down_too(engine: FakeEngine) -> None:
    app = make_app(engine, Clock(), failures_before_delay=2, failure_max_delay_s=60.0)
    client = app.test_client()
    statuses = []
    for _ in range(4):
        answer = await client.get(
            "/admin/status", headers={"Authorization": "Bearer nope"}, scope_base=REMOTE
        )
        statuses.append(answer.status_code)
    assert statuses == [401, 401, 401, 429]
    refused = await client.get(
        "/admin/status", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, scope_base=REMOTE
    )
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    assert (await refused.get_json())["error"]["code"] == "too_many_failed_logins"


def test_the_failure_table_is_bounded() -> None:
    throttle = LoginThrottle(failures_before_delay=0, max_delay_s=60.0, max_clients=3)
    for n in range(10):
        throttle.failed(f"192.0.2.{n}", 0.0)
    assert len(throttle) == 3
    assert throttle.wait_s("192.0.2.9", 0.0) == 1.0
    assert throttle.wait_s("192.0.2.0", 0.0) == 0.0  # the oldest was forgotten
    # IPv6 clients are counted by their /64: one host has billions of addresses.
    throttle.failed("2001:db8::1", 0.0)
    assert throttle.wait_s("2001:db8::ffff:2", 0.0) == 1.0
    assert throttle.wait_s("2001:db8:0:1::1", 0.0) == 0.0


def test_a_client_is_forgiven_after_a_quiet_spell() -> None:
    throttle = LoginThrottle(failures_before_delay=1, max_delay_s=10.0)
    throttle.failed("192.0.2.1", 0.0)
    assert throttle.failed("192.0.2.1", 0.0) == 1.0
    assert throttle.failed("192.0.2.1", 5.0) == 2.0
    # Quiet for max_delay_s after its wait ended: a fresh start.
    assert throttle.failed("192.0.2.1", 7.0 + 10.01) == 0.0


def test_sessions_are_bounded_and_expired_ones_are_dropped() -> None:
    sessions = auth.Sessions(ttl_s=100.0, max_sessions=3)
    tokens = [sessions.open(float(n)) for n in range(5)]
    assert [sessions.is_live(t, 5.0) for t in tokens] == [False, False, True, True, True]
    assert sessions.is_live(tokens[4], 104.0)
    assert not sessions.is_live(tokens[4], 104.0 + 1e-6)
    assert len(sessions) == 2  # an expired session is dropped when seen
    sessions.close(tokens[3])
    assert not sessions.is_live(tokens[3], 5.0)


async def test_a_huge_login_body_is_refused_by_its_length(engine: FakeEngine) -> None:
    app = make_app(engine, Clock(), login_max_bytes=4096)
    client = app.test_client()
    with trio.fail_after(5):
        answer = await client.post(
            "/dashboard/login",
            data=b"a=b&" * 2048,  # 8 KiB
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            scope_base=REMOTE,
        )
    assert answer.status_code == 413
    error = (await answer.get_json())["error"]
    assert error["code"] == "body_too_large"
    assert "4096" in error["message"]


async def test_a_streamed_login_body_is_refused_once_past_the_limit(engine: FakeEngine) -> None:
    app = make_app(engine, Clock(), login_max_bytes=4096)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    with trio.fail_after(5):
        async with app.test_client().request(
            "/dashboard/login", method="POST", headers=headers, scope_base=REMOTE
        ) as connection:
            # No Content-Length: 5 KiB in pieces, and the body never ends.
            for _ in range(5):
                await connection.send(b"a=b&" * 256)
            body = await connection.receive()
            assert cast(Any, connection).status_code == 413
            assert b"body_too_large" in body


async def test_a_small_login_form_still_works(engine: FakeEngine) -> None:
    app = make_app(engine, Clock(), login_max_bytes=64)
    assert await _login(app)
    wrong = await app.test_client().post(
        "/dashboard/login", form={"key": "x" * 100}, scope_base=REMOTE
    )
    assert wrong.status_code == 413


def test_session_and_login_keys_are_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "yard.toml"
    path.write_text(
        "[server]\ndashboard_session_ttl_s = 60\ndashboard_login_max_bytes = '1KiB'\n"
        "admin_failures_before_delay = 0\nadmin_failure_max_delay_s = 30\n"
    )
    server = load_config(path, env={}).server
    assert server.dashboard_session_ttl_s == 60.0
    assert server.dashboard_login_max_bytes == 1024
    assert server.admin_failures_before_delay == 0
    assert server.admin_failure_max_delay_s == 30.0
    path.write_text(
        "[server]\ndashboard_session_ttl_s = 0\ndashboard_login_max_bytes = 0\n"
        "admin_failures_before_delay = -1\nadmin_failure_max_delay_s = 0\n"
    )
    with pytest.raises(ConfigError) as bad:
        load_config(path, env={})
    named = " ".join(bad.value.errors)
    for key in (
        "dashboard_session_ttl_s",
        "dashboard_login_max_bytes",
        "admin_failures_before_delay",
        "admin_failure_max_delay_s",
    ):
        assert f"server.{key}" in named

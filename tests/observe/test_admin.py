from __future__ import annotations

import json

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from quart_trio import QuartTrio

from tests.observe.conftest import ADMIN_KEY, LOOPBACK, REMOTE, make_app, open_stream
from yard.core.decisions import Dispatch, Reject
from yard.core.events import AdminForgetProfile, AdminLoad, AdminPin, AdminUnload
from yard.observe import Observer
from yard.observe.admin import new_lines
from yard.testing.engine import FakeEngine

BEARER = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/status"),
        ("POST", "/admin/backends/llm/load"),
        ("POST", "/admin/backends/llm/unpin"),
        ("GET", "/admin/backends/llm/log"),
        ("DELETE", "/admin/profiles/llm"),
    ],
)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-key"}, {"Authorization": f"Basic {ADMIN_KEY}"}],
    ids=["missing", "wrong", "not-bearer"],
)
async def test_admin_endpoints_refuse_a_missing_or_wrong_key(
    app: QuartTrio, engine: FakeEngine, method: str, path: str, headers: dict[str, str]
) -> None:
    client = app.test_client()
    call = {"GET": client.get, "POST": client.post, "DELETE": client.delete}[method]
    response = await call(path, headers=headers, scope_base=LOOPBACK)
    assert response.status_code == 401
    body = await response.get_json()
    assert body["error"]["code"] == "invalid_admin_key"
    assert body["error"]["type"] == "authentication_error"
    assert body["error"]["param"] is None
    assert engine.sent == []


async def test_without_an_admin_key_admin_answers_loopback_only(engine: FakeEngine) -> None:
    app = make_app(engine, admin_key=None)
    client = app.test_client()
    remote = await client.post("/admin/backends/llm/load", scope_base=REMOTE)
    assert remote.status_code == 403
    assert (await remote.get_json())["error"]["code"] == "admin_loopback_only"
    assert engine.sent == []
    local = await client.post("/admin/backends/llm/load", scope_base=LOOPBACK)
    assert local.status_code == 202
    assert engine.sent == [AdminLoad(backend="llm")]


async def test_the_key_works_from_any_address(app: QuartTrio) -> None:
    response = await app.test_client().get("/admin/status", headers=BEARER, scope_base=REMOTE)
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("action", "event"),
    [
        ("load", AdminLoad(backend="tts")),
        ("unload", AdminUnload(backend="tts")),
        ("pin", AdminPin(backend="tts", pinned=True)),
        ("unpin", AdminPin(backend="tts", pinned=False)),
    ],
)
async def test_backend_actions_send_the_admin_event(
    app: QuartTrio, engine: FakeEngine, action: str, event: object
) -> None:
    response = await app.test_client().post(f"/admin/backends/tts/{action}", headers=BEARER)
    assert response.status_code == 202
    assert await response.get_json() == {
        "backend": "tts",
        "state": "stopped",
        "pinned": False,
        "action": action,
        "accepted": True,
    }
    assert engine.sent == [event]


async def test_unknown_backends_and_actions_are_404(app: QuartTrio, engine: FakeEngine) -> None:
    client = app.test_client()
    unknown = await client.post("/admin/backends/nope/load", headers=BEARER)
    assert unknown.status_code == 404
    assert (await unknown.get_json())["error"]["code"] == "backend_not_found"
    action = await client.post("/admin/backends/llm/explode", headers=BEARER)
    assert action.status_code == 404
    assert (await action.get_json())["error"]["code"] == "unknown_action"
    assert engine.sent == []


class RecordingStore:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    async def forget(self, backend: str) -> None:
        self.forgotten.append(backend)


async def test_forgetting_a_profile_tells_the_scheduler_and_the_store(
    app: QuartTrio, engine: FakeEngine
) -> None:
    store = RecordingStore()
    observer = app.extensions[Observer.KEY]
    observer.profiles = store
    response = await app.test_client().delete("/admin/profiles/llm", headers=BEARER)
    assert response.status_code == 200
    assert await response.get_json() == {"backend": "llm", "forgotten": True, "store": True}
    assert engine.sent == [AdminForgetProfile(backend="llm")]
    assert store.forgotten == ["llm"]


async def test_status_is_what_the_dashboard_shows(app: QuartTrio, engine: FakeEngine) -> None:
    engine.decide(Dispatch(reason="llm is ready and idle", request_id="r1", backend="llm"))
    engine.decide(
        Reject(
            reason="llm died",
            request_id="r1",
            status=502,
            code="backend_failed",
            message="the backend failed",
        )
    )
    engine.logs["llm"] = [f"line {i}" for i in range(30)]
    response = await app.test_client().get("/admin/status", headers=BEARER)
    status = await response.get_json()
    assert [b["name"] for b in status["backends"]] == ["llm", "tts"]
    assert status["backends"][0]["models"] == ["tiny-llm", "tiny-llm-chat"]
    gpu = next(d for d in status["devices"] if d["name"] == "gpu0")
    assert gpu["backends"] == [
        {
            "backend": "llm",
            "state": "ready",
            "profile_bytes": 4 * 2**30,
            "reserved_bytes": 5 * 2**30,
            "live_bytes": 3 * 2**30,
        }
    ]
    assert [d["kind"] for d in status["decisions"]] == ["reject", "dispatch"]
    (failure,) = status["failures"]
    # The reject names no backend; the dispatch before it does.
    assert failure["backend"] == "llm"
    assert failure["code"] == "backend_failed"
    assert failure["log"] == [f"line {i}" for i in range(18, 30)]
    assert status["host_only"] is False
    assert status["profiles"] == [
        {"backend": "llm", "gpu_bytes": 4 * 2**30, "host_bytes": 2**30, "load_s": 12.5}
    ]


async def test_log_tail_streams_existing_then_new_lines(
    app: QuartTrio, engine: FakeEngine, autojump_clock: trio.abc.Clock
) -> None:
    engine.logs["llm"] = ["listening on 127.0.0.1:4000"]
    async with open_stream(app, "/admin/backends/llm/log", headers=BEARER) as stream:
        await stream.read_until(b"listening")
        engine.logs["llm"].append("GET /health 200")
        received = await stream.read_until(b"GET /health")
    assert received.count(b"data: ") == 2
    assert b"data: listening on 127.0.0.1:4000\n\n" in received
    assert b"data: GET /health 200\n\n" in received


def test_new_lines_follows_a_log_whose_head_falls_off() -> None:
    assert new_lines([], ["a", "b"]) == ["a", "b"]
    assert new_lines(["a", "b"], ["a", "b"]) == []
    assert new_lines(["a", "b"], ["b", "c", "d"]) == ["c", "d"]
    assert new_lines(["x", "y"], ["p", "q"]) == ["p", "q"]
    # A repeated line is matched with what came before it.
    assert new_lines(["a", "tick", "b", "tick"], ["b", "tick", "tick"]) == ["tick"]


def test_status_document_is_json(engine: FakeEngine) -> None:
    observer = Observer(engine=engine)

    async def build() -> str:
        return json.dumps(observer.status())

    assert json.loads(trio.run(build))["queue"] == {"length": 0, "items": []}


@given(
    start=st.integers(0, 50),
    seen=st.integers(0, 30),
    dropped=st.integers(0, 40),
    grown=st.integers(0, 30),
)
def test_new_lines_returns_exactly_what_was_appended(
    start: int, seen: int, dropped: int, grown: int
) -> None:
    lines = [f"line {i}" for i in range(200)]
    previous = lines[start : start + seen]
    end = start + seen + grown
    current = lines[min(start + dropped, end) : end]
    fresh = new_lines(previous, current)
    if not previous or start + dropped >= start + seen:
        # Nothing in common: everything in the log is new to the reader.
        assert fresh == current
    else:
        assert fresh == lines[start + seen : end]


async def test_a_ready_backend_with_requests_in_flight_shows_as_busy(
    app: QuartTrio, engine: FakeEngine
) -> None:
    engine.set_backend("llm", inflight=2)
    status = await (await app.test_client().get("/admin/status", headers=BEARER)).get_json()
    llm = status["backends"][0]
    assert (llm["state"], llm["core_state"], llm["inflight"]) == ("busy", "ready", 2)
    engine.set_backend("tts", queued=3)
    status = await (await app.test_client().get("/admin/status", headers=BEARER)).get_json()
    assert status["backends"][1]["queued"] == 3
    gpu = next(d for d in status["devices"] if d["name"] == "gpu0")
    assert gpu["backends"][0]["state"] == "busy"

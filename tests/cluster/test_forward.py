"""Forwarding synchronous requests between nodes (yard.cluster.forward and the
gateway's hook): the rules, on two real gateways on loopback with fake
engines and a fake backend; no database."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import trio

from yard.app.web import Parts, create_app, serve_app
from yard.cluster.forward import (
    ARRIVED_AT,
    FORWARDED_BY,
    PRIORITY,
    SIGNATURE,
    Forwarder,
    Target,
    forward_headers,
    sign,
    vouch,
)
from yard.cluster.node import Node
from yard.cluster.policy import Peer
from yard.config import AppConfig, BackendConfig, Config, ServerConfig
from yard.core.spec import SchedulerConfig
from yard.engine import Engine
from yard.errors import Rejected
from yard.h1.upstream import ProxyRequest
from yard.observe.metrics import REQUESTS
from yard.testing.engine import FakeEngine
from yard.testing.fake import FakeBackend, serve_fake

SECRET = "cluster-secret"
APPS = {"chat": AppConfig(name="chat", key="key-chat", default_priority=60.0, max_priority=80.0)}
CHAT = {"model": "big", "messages": [{"role": "user", "content": "hi"}]}


# -- the pure rules ---------------------------------------------------------------


def test_a_signed_arrival_is_believed() -> None:
    text = b"1700000000.25"
    signature = sign(SECRET, "n1", text.decode()).encode()
    assert vouch(
        secret=SECRET, forwarded_by=b"n1", arrived_at=text, signature=signature, now_wall=2e9
    ) == (True, 1700000000.25)


@pytest.mark.parametrize(
    ("secret", "by", "signature", "counts"),
    [
        (None, b"n1", "good", True),  # no secret: the header counts, no arrival is believed
        (SECRET, b"n1", None, False),  # unsigned
        (SECRET, b"n1", "0" * 64, False),  # a wrong signature
        (SECRET, b"n2", "good", False),  # signed for another node's name
        ("other-secret", b"n1", "good", False),  # another cluster's secret
        (SECRET, None, "good", False),  # not forwarded at all
    ],
)
def test_an_untrusted_arrival_is_ignored(
    secret: str | None, by: bytes | None, signature: str | None, counts: bool
) -> None:
    text = "1700000000.25"
    if signature == "good":
        signature = sign(SECRET, "n1", text)
    vouched = vouch(
        secret=secret,
        forwarded_by=by,
        arrived_at=text.encode(),
        signature=None if signature is None else signature.encode(),
        now_wall=2e9,
    )
    assert vouched == (counts, None)


def test_an_arrival_from_the_future_counts_as_now() -> None:
    text = "1800000000.0"
    arrival = vouch(
        secret=SECRET,
        forwarded_by=b"n1",
        arrived_at=text.encode(),
        signature=sign(SECRET, "n1", text).encode(),
        now_wall=1700000000.0,
    )
    assert arrival == (True, 1700000000.0)


def test_a_signed_nan_is_ignored() -> None:
    arrival = vouch(
        secret=SECRET,
        forwarded_by=b"n1",
        arrived_at=b"nan",
        signature=sign(SECRET, "n1", "nan").encode(),
        now_wall=1.0,
    )
    assert arrival == (True, None)  # from a node, but it ages from now


def test_forwarded_headers_replace_what_a_client_sent_and_drop_hop_by_hop() -> None:
    client = [
        (b"authorization", b"Bearer key-chat"),
        (b"connection", b"keep-alive, x-private"),
        (b"x-private", b"1"),
        (b"keep-alive", b"timeout=5"),
        (b"host", b"a:1"),
        (b"content-length", b"12"),
        (FORWARDED_BY, b"liar"),
        (ARRIVED_AT, b"0"),
        (SIGNATURE, b"forged"),
        (PRIORITY, b"100"),
        (b"x-yard-start-within", b"30"),
    ]
    sent = forward_headers(client, node="n1", arrived_at=1700000000.5, priority=70.0, secret=SECRET)
    assert sent == [
        (b"authorization", b"Bearer key-chat"),
        (b"x-yard-start-within", b"30"),
        (FORWARDED_BY, b"n1"),
        (PRIORITY, b"70.0"),
        (ARRIVED_AT, b"1700000000.5"),
        (SIGNATURE, sign(SECRET, "n1", "1700000000.5").encode()),
    ]
    unsigned = forward_headers(client, node="n1", arrived_at=1.0, priority=1.0, secret=None)
    assert SIGNATURE not in dict(unsigned)


def test_routing_sends_a_model_to_the_node_that_serves_it_and_jobs_stay() -> None:
    forwarder = Forwarder(node="a", secret=None, pool=cast(Any, None))
    forwarder.update(
        [
            Peer(name="a", serves=frozenset({"small"})),
            Peer(name="b", serves=frozenset({"big", "small"}), ready=frozenset({"big", "small"})),
        ],
        {"a": "http://a:1", "b": "http://b:1"},
    )
    target = forwarder.route("big", served_here=False, is_async=False)
    assert isinstance(target, Target) and (target.node, target.url) == ("b", "http://b:1")
    # Loaded there, not here: a synchronous request goes there ...
    assert forwarder.route("small", served_here=True, is_async=False) is not None
    # ... a job for a model served here goes to the shared queue from here,
    assert forwarder.route("small", served_here=True, is_async=True) is None
    # a job for a model only another node serves is forwarded,
    assert forwarder.route("big", served_here=False, is_async=True) is not None
    # and a model nobody serves is refused here.
    assert forwarder.route("nobody", served_here=False, is_async=False) is None


# -- two gateways -------------------------------------------------------------------


def _config(backends: dict[str, BackendConfig]) -> Config:
    return Config(
        path=Path("/nonexistent/yard.toml"),
        server=ServerConfig(default_priority=50.0),
        scheduler=SchedulerConfig(),
        devices={},
        apps=APPS,
        backends=backends,
    )


@dataclass
class Pair:
    """Node ``a`` serves ``small``; node ``b`` serves ``big`` and ``small``."""

    a: httpx.AsyncClient
    b: httpx.AsyncClient
    a_engine: FakeEngine
    b_engine: FakeEngine
    a_forwarder: Forwarder
    b_url: str
    a_jobs: _Jobs


async def _gateway(
    nursery: trio.Nursery,
    config: Config,
    engine: FakeEngine,
    forwarder: Forwarder,
    jobs: _Jobs | None = None,
) -> tuple[str, Parts]:
    health = {"status": "ok", "node": forwarder.node, "database": "ok", "nodes": []}
    node = cast(
        Node, SimpleNamespace(forwarder=forwarder, name=forwarder.node, health=lambda: health)
    )
    parts = Parts(
        config=config, engine=cast(Engine, engine), started_at=time.time(), cluster=node, jobs=jobs
    )
    forwarder._pool = parts.pool
    binds = await nursery.start(serve_app, create_app(parts), "127.0.0.1", 0)
    return str(binds[0]), parts


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    async with trio.open_nursery() as nursery:
        backend = await nursery.start(serve_fake, FakeBackend())
        small = BackendConfig(name="small", models=("small",), command=("true",))
        big = BackendConfig(name="big", models=("big",), command=("true",))
        a_engine = FakeEngine(
            {"small": backend.base_url}, auto_dispatch=True, lost="fail", queue_time_s=0.0125
        )
        b_engine = FakeEngine(
            {"small": backend.base_url, "big": backend.base_url},
            auto_dispatch=True,
            lost="fail",
            queue_time_s=0.0125,
        )
        a_fw = Forwarder(node="a", secret=SECRET, pool=cast(Any, None))
        b_fw = Forwarder(node="b", secret=SECRET, pool=cast(Any, None))
        a_jobs = _Jobs()
        a_url, a_rt = await _gateway(nursery, _config({"small": small}), a_engine, a_fw, a_jobs)
        b_url, b_rt = await _gateway(nursery, _config({"small": small, "big": big}), b_engine, b_fw)
        peers = [
            Peer(name="a", serves=frozenset({"small"})),
            Peer(name="b", serves=frozenset({"small", "big"}), ready=frozenset({"small", "big"})),
        ]
        urls = {"a": a_url, "b": b_url}
        a_fw.update(peers, urls)
        b_fw.update(peers, urls)
        headers = {"authorization": "Bearer key-chat"}
        async with (
            httpx.AsyncClient(base_url=a_url, headers=headers, timeout=10) as a,
            httpx.AsyncClient(base_url=b_url, headers=headers, timeout=10) as b,
        ):
            yield Pair(a, b, a_engine, b_engine, a_fw, b_url, a_jobs)
        nursery.cancel_scope.cancel()
    a_rt.pool.close_idle()
    b_rt.pool.close_idle()


async def test_a_request_for_a_model_this_node_lacks_is_answered_by_the_node_that_has_it(
    pair: Pair,
) -> None:
    counted = REQUESTS.labels(model="big", backend="", outcome="forwarded")._value.get()
    with trio.fail_after(10):
        sent_at = time.time()
        response = await pair.a.post(
            "/v1/chat/completions", json=CHAT, headers={"x-yard-priority": "99"}
        )
    assert response.status_code == 200, response.text
    assert response.headers["x-yard-node"] == "b"
    assert pair.a_engine.admissions == []
    [admission] = pair.b_engine.admissions
    submitted = admission.submitted
    assert submitted["backend"] == "big"
    # Clamped to the app's maximum on node a, the same on node b.
    assert submitted["priority"] == 80.0
    # The arrival on node a, signed, so node b ages it from then (engine clock).
    assert submitted["arrived_at"] is not None
    waited = pair.b_engine.now() - submitted["arrived_at"]
    assert 0.0 <= waited <= time.time() - sent_at + 0.01
    # The backend saw the client's request, without the cluster's headers.
    echo = json.loads(response.content)
    names = {name for name, _ in echo["headers"]}
    assert not names & {"x-yard-forwarded-by", "x-yard-arrived-at", "x-yard-cluster-signature"}
    # Node a counts it as forwarded (the whole request is counted by node b).
    forwarded = REQUESTS.labels(model="big", backend="", outcome="forwarded")
    assert forwarded._value.get() == counted + 1


async def test_a_model_ready_elsewhere_and_not_here_is_forwarded(pair: Pair) -> None:
    with trio.fail_after(10):
        response = await pair.a.post("/v1/chat/completions", json={**CHAT, "model": "small"})
    assert response.status_code == 200
    assert response.headers["x-yard-node"] == "b"
    assert [a.submitted["backend"] for a in pair.b_engine.admissions] == ["small"]


def _from_node(node: str) -> dict[str, str]:
    """The cluster headers a request forwarded by ``node`` carries."""
    sent = forward_headers([], node=node, arrived_at=time.time(), priority=50.0, secret=SECRET)
    return {name.decode(): value.decode() for name, value in sent}


async def test_a_forwarded_request_is_never_forwarded_again(pair: Pair) -> None:
    # Node a's registry says b should serve "small"; a forwarded request is served here anyway.
    with trio.fail_after(10):
        response = await pair.a.post(
            "/v1/chat/completions", json={**CHAT, "model": "small"}, headers=_from_node("b")
        )
    assert response.status_code == 200
    assert "x-yard-node" not in response.headers
    assert pair.b_engine.admissions == []
    assert [a.submitted["backend"] for a in pair.a_engine.admissions] == ["small"]
    # And a model this node lacks is refused here, not sent on.
    with trio.fail_after(10):
        response = await pair.a.post("/v1/chat/completions", json=CHAT, headers=_from_node("b"))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    assert pair.b_engine.admissions == []


async def test_a_clients_own_forwarded_by_header_does_not_turn_forwarding_off(
    pair: Pair,
) -> None:
    # Before: the bare header made node a serve or refuse it itself (404 here).
    with trio.fail_after(10):
        bare = await pair.a.post(
            "/v1/chat/completions", json=CHAT, headers={"x-yard-forwarded-by": "b"}
        )
        old = repr(time.time())
        forged = await pair.a.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={
                "x-yard-forwarded-by": "b",
                "x-yard-arrived-at": old,
                "x-yard-cluster-signature": sign("guess", "b", old),
            },
        )
    assert (bare.status_code, forged.status_code) == (200, 200), bare.text
    assert bare.headers["x-yard-node"] == forged.headers["x-yard-node"] == "b"
    assert [a.submitted["backend"] for a in pair.b_engine.admissions] == ["big", "big"]


def test_a_model_served_only_by_a_node_that_is_away_is_away_not_unknown() -> None:
    forwarder = Forwarder(node="a", secret=None, pool=cast(Any, None), retry_after_s=4.0)
    forwarder.update(
        [
            Peer(name="a", serves=frozenset({"small"})),
            Peer(name="b", up=False, serves=frozenset({"big"}), backend_of={"big": "big-llm"}),
        ],
        {"a": "http://a:1", "b": "http://b:1"},
    )
    with pytest.raises(Rejected) as away:
        forwarder.route("big", served_here=False, is_async=False)
    assert (away.value.status, away.value.code, away.value.retry_after_s) == (
        503,
        "model_away",
        4.0,
    )
    assert "node b" in away.value.message
    # A job for it goes into the shared queue of its backend.
    assert forwarder.route("big", served_here=False, is_async=True) is None
    assert forwarder.queue_for("big") == "big-llm"
    assert forwarder.route("nobody", served_here=False, is_async=False) is None
    assert forwarder.queue_for("nobody") is None


async def test_a_request_for_a_model_whose_node_is_away_is_503_or_a_stored_job(
    pair: Pair,
) -> None:
    # Before: 502 node_unreachable while b's heartbeat was fresh, then 404
    # model_not_found, for requests and jobs alike.
    peers = [
        Peer(name="a", serves=frozenset({"small"})),
        Peer(name="b", up=False, serves=frozenset({"big"}), backend_of={"big": "big"}),
    ]
    pair.a_forwarder.update(peers, {"b": pair.b_url})
    with trio.fail_after(10):
        sync = await pair.a.post("/v1/chat/completions", json=CHAT)
        job = await pair.a.post(
            "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
        )
    assert sync.status_code == 503
    assert sync.json()["error"]["code"] == "model_away"
    assert "node b" in sync.json()["error"]["message"]
    assert int(sync.headers["retry-after"]) >= 1
    assert job.status_code == 202, job.text
    ((request, _),) = pair.a_jobs.submitted
    assert (request.backend, request.model) == ("big", "big")
    assert pair.b_engine.admissions == []


class _Jobs:
    """The job service of node a: what it was handed."""

    def __init__(self) -> None:
        self.submitted: list[tuple[ProxyRequest, bool]] = []

    async def submit(self, request: ProxyRequest, *, rerun_safe: bool) -> dict[str, object]:
        self.submitted.append((request, rerun_safe))
        return {"id": "job-1", "status": "queued"}


async def test_an_unsigned_arrival_header_is_ignored(pair: Pair) -> None:
    old = repr(time.time() - 3600)
    with trio.fail_after(10):
        forged = await pair.b.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={"x-yard-forwarded-by": "a", "x-yard-arrived-at": old},
        )
        wrong = await pair.b.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={
                "x-yard-forwarded-by": "a",
                "x-yard-arrived-at": old,
                "x-yard-cluster-signature": sign("guess", "a", old),
            },
        )
        signed = await pair.b.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={
                "x-yard-forwarded-by": "a",
                "x-yard-arrived-at": old,
                "x-yard-cluster-signature": sign(SECRET, "a", old),
            },
        )
    assert (forged.status_code, wrong.status_code, signed.status_code) == (200, 200, 200)
    arrivals = [a.submitted["arrived_at"] for a in pair.b_engine.admissions]
    assert arrivals[:2] == [None, None]
    assert arrivals[2] is not None
    assert pair.b_engine.now() - arrivals[2] == pytest.approx(3600, abs=5)


async def test_a_forwarded_requests_signature_is_checked_once(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    headers = _from_node("a")
    signed: list[str] = []

    def counting_sign(secret: str, node: str, arrived_at: str) -> str:
        signed.append(node)
        return sign(secret, node, arrived_at)

    monkeypatch.setattr("yard.cluster.forward.sign", counting_sign)
    with trio.fail_after(10):
        response = await pair.b.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200, response.text
    assert signed == ["a"]  # one HMAC: whether it counts and its arrival
    assert pair.b_engine.admissions[0].submitted["arrived_at"] is not None


async def test_a_node_that_cannot_be_reached_is_a_clear_502(pair: Pair) -> None:
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    peers = [
        Peer(name="a", serves=frozenset({"small"})),
        Peer(name="b", serves=frozenset({"big"}), ready=frozenset({"big"})),
    ]
    pair.a_forwarder.update(peers, {"b": closed})
    with trio.fail_after(10):
        response = await pair.a.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "node_unreachable"
    assert "node b" in error["message"]

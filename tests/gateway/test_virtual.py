"""The gateway with the real engine and scheduler core on virtual time: who
goes first, and what is refused at once, at exact times (scripted backend
processes that load in 2 s, the in-process fake backend, clients on loopback
TCP pairs)."""

from __future__ import annotations

import json

import trio
import trio.lowlevel
import trio.testing

from tests.gateway.conftest import virtual_yard
from tests.http.virtual import Reply
from yard.testing.fake import Options

CHAT = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _key(app: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer key-{app}")]


def _ended_at(reply: Reply) -> float:
    assert reply.complete and reply.pieces
    return reply.pieces[-1][0]


async def test_two_apps_contending_for_one_slot_are_served_in_priority_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    replies: dict[str, Reply] = {}
    async with virtual_yard(Options(service_time=0.5)) as yard:

        async def send(label: str, app: str) -> None:
            replies[label] = await yard.request("POST", "/v1/chat/completions", CHAT, _key(app))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "first", "batch")
            await trio.sleep(2.25)  # loaded at 2.0: first is served until 2.5
            nursery.start_soon(send, "batch", "batch")
            await trio.sleep(0.125)
            nursery.start_soon(send, "chat", "chat")
    # chat (priority 60) arrived last and still goes before batch (10).
    assert {label: _ended_at(reply) for label, reply in replies.items()} == {
        "first": 2.5,
        "chat": 3.0,
        "batch": 3.5,
    }
    ids = {label: reply.header("x-yard-request-id")[0] for label, reply in replies.items()}
    assert [seen for _, seen in yard.upstream.seen] == [ids["first"], ids["chat"], ids["batch"]]


async def test_a_deadline_that_cannot_be_met_is_refused_at_once_unless_late_is_allowed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    replies: dict[str, Reply] = {}
    async with virtual_yard(Options(service_time=1.0)) as yard:
        await yard.request("POST", "/v1/chat/completions", CHAT, _key("chat"))  # loaded, 3.0

        async def send(label: str, headers: list[tuple[str, str]]) -> None:
            replies[label] = await yard.request(
                "POST", "/v1/chat/completions", CHAT, _key("chat") + headers
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, "busy", [])
            await trio.sleep(0.5)
            sent = trio.current_time()
            await send("refused", [("x-yard-start-within", "0.2")])
            assert trio.current_time() == sent
            await send("late", [("x-yard-start-within", "0.2"), ("x-yard-allow-late", "true")])
    refused = replies["refused"]
    assert refused.status == 409
    assert json.loads(refused.body)["error"]["code"] == "deadline_infeasible"
    assert (replies["busy"].status, _ended_at(replies["busy"])) == (200, 4.0)
    # Late, but served: after busy, for its own second of service.
    assert (replies["late"].status, _ended_at(replies["late"])) == (200, 5.0)


async def test_client_that_disconnects_mid_stream_frees_the_slot_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stream_body = json.dumps({"model": "tiny", "stream": True, "chunks": 10_000, "interval": 0.25})
    async with virtual_yard(Options()) as yard:
        engine = yard.engine
        client = await yard.open("POST", "/v1/chat/completions", stream_body.encode(), _key("chat"))
        first = await client.receive_some(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        assert engine.statistics().inflight == 1
        await trio.sleep(1)
        await client.aclose()
        left = trio.current_time()
        while engine.statistics().inflight:
            await trio.lowlevel.checkpoint()
        assert trio.current_time() == left
        stats = engine.statistics()
        assert stats.requests.get("cancelled") == 1
        assert stats.requests.get("ok", 0) == 0
        assert engine.snapshot().backends[0].inflight == 0

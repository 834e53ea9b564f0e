"""The data plane against a fake engine and an in-process fake backend:
routing, headers, errors, streaming, disconnects, lost upstreams."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from tests.http.conftest import (
    APPS,
    Gateway,
    GatewayFactory,
    make_config,
    observed,
)
from tests.http.upstream import Scripted, serve_scripted
from tests.http.virtual import VirtualGateway
from yard.config import AppConfig
from yard.errors import Rejected
from yard.observe.metrics import REQUESTS
from yard.testing.engine import FakeEngine

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def _echo(response: httpx.Response) -> dict[str, object]:
    data = response.json()
    assert isinstance(data, dict)
    return data


def _headers(echo: dict[str, object]) -> dict[str, str]:
    pairs = echo["headers"]
    assert isinstance(pairs, list)
    return {k: v for k, v in pairs}


async def test_chat_request_is_routed_by_model_and_body_passes_unchanged(gw: Gateway) -> None:
    body = b'{"model":"tiny-alias",  "messages":[],"extra":"\\u00e9"}'
    response = await gw.client.post(
        "/v1/chat/completions?x=1", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    echo = _echo(response)
    assert echo["target"] == "/v1/chat/completions?x=1"
    assert echo["body"] == body.decode()
    assert gw.upstream.bodies == [body]
    (admission,) = gw.engine.admissions
    assert admission.backend == "llm"
    assert admission.reports == [("ok", "")]
    assert response.headers["x-yard-request-id"] == admission.request_id
    assert response.headers["x-yard-queue-ms"] == "12.5"
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["x-backend"] == "fake"


async def test_yard_headers_and_hop_by_hop_headers_are_not_forwarded(gw: Gateway) -> None:
    response = await gw.client.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={
            "x-yard-priority": "7",
            "x-custom": "kept",
            "authorization": "Bearer backend-key",
            "connection": "keep-alive, x-hop",
            "x-hop": "for this connection only",
        },
    )
    sent = _headers(_echo(response))
    assert sent["x-custom"] == "kept"
    assert sent["content-length"] == str(len(gw.upstream.bodies[0]))
    assert [name for name in sent if name.startswith("x-yard-")] == ["x-yard-request-id"]
    assert sent["x-yard-request-id"] == gw.engine.admissions[0].request_id
    assert "connection" not in sent
    assert "x-hop" not in sent
    # No app keys configured: the key is not yard's, so it goes on to the backend.
    assert sent["authorization"] == "Bearer backend-key"
    assert sent["host"] == f"127.0.0.1:{gw.upstream.port}"


async def test_without_app_keys_requests_belong_to_the_local_app(gw: Gateway) -> None:
    await gw.client.post("/v1/chat/completions", json=CHAT, headers={"x-yard-priority": "500"})
    (admission,) = gw.engine.admissions
    assert admission.submitted["app"] == "local"
    # Clamped to the scheduler's maximum (the local app has the full range).
    assert admission.submitted["priority"] == 100.0


async def test_priority_is_clamped_to_the_app_maximum_and_the_key_is_not_forwarded(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(config=make_config(apps=APPS))
    async with gw.client:
        response = await gw.client.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={"authorization": "Bearer key-batch", "x-yard-priority": "90"},
        )
        plain = await gw.client.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer key-chat"}
        )
    assert response.status_code == 200
    assert "authorization" not in _headers(_echo(response))
    batch, chat = gw.engine.admissions
    assert (batch.submitted["app"], batch.submitted["priority"]) == ("batch", 20.0)
    assert (chat.submitted["app"], chat.submitted["priority"]) == ("chat", 60.0)
    assert plain.status_code == 200


async def test_a_missing_or_unknown_key_is_401_as_openai_answers(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(config=make_config(apps=APPS))
    async with gw.client:
        missing = await gw.client.post("/v1/chat/completions", json=CHAT)
        wrong = await gw.client.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer nope"}
        )
        models = await gw.client.get("/v1/models")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"
    assert missing.json()["error"]["type"] == "authentication_error"
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert models.status_code == 401
    assert gw.engine.admissions == []


async def test_errors_have_the_openai_shape_and_stable_codes(gw: Gateway) -> None:
    cases = [
        ({"json": {"model": "nope"}}, 404, "model_not_found"),
        (
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            "invalid_json",
        ),
        ({"json": {"messages": []}}, 400, "model_required"),
        ({"json": CHAT, "headers": {"x-yard-priority": "high"}}, 400, "invalid_priority"),
        ({"json": CHAT, "headers": {"x-yard-start-by": "tomorrow"}}, 400, "invalid_deadline"),
        ({"json": CHAT, "headers": {"x-yard-start-within": "-3"}}, 400, "invalid_deadline"),
        ({"json": CHAT, "headers": {"x-yard-allow-late": "maybe"}}, 400, "invalid_header"),
    ]
    for kwargs, status, code in cases:
        response = await gw.client.post("/v1/chat/completions", **kwargs)  # type: ignore[arg-type]
        assert response.status_code == status, (kwargs, response.text)
        error = response.json()["error"]
        assert error["code"] == code
        assert error["param"] is None
        assert error["message"]
        assert response.headers["x-yard-request-id"]
    assert gw.engine.admissions == []


async def test_a_body_over_the_limit_is_refused_with_413(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(config=make_config(max_body_bytes=1000))
    async with gw.client:
        big = {"model": "tiny", "pad": "x" * 2000}
        response = await gw.client.post("/v1/chat/completions", json=big)

        async def chunked() -> AsyncIterator[bytes]:
            for _ in range(4):
                yield b"x" * 400

        streamed = await gw.client.post("/v1/chat/completions", content=chunked())
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    assert streamed.status_code == 413
    assert gw.engine.admissions == []


async def test_core_rejections_become_errors_with_status_and_retry_after(gw: Gateway) -> None:
    gw.engine.rejecting["llm"] = Rejected(
        status=503, code="queue_full", message="too many waiting", retry_after_s=2.5
    )
    full = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert full.status_code == 503
    assert full.headers["retry-after"] == "3"
    assert full.json()["error"] == {
        "message": "too many waiting",
        "type": "server_error",
        "code": "queue_full",
        "param": None,
    }
    gw.engine.rejecting["llm"] = Rejected(status=507, code="does_not_fit", message="too big")
    fit = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert (fit.status_code, fit.json()["error"]["code"]) == (507, "does_not_fit")
    assert gw.upstream.requests == []


async def test_deadline_headers_reach_the_engine_on_its_clock(
    vgw: VirtualGateway[FakeEngine], autojump_clock: trio.testing.MockClock
) -> None:
    await trio.sleep(100)
    body = json.dumps(CHAT).encode()
    within = [("x-yard-start-within", "30"), ("x-yard-allow-late", "true")]
    await vgw.request("POST", "/v1/chat/completions", body, within)
    long_past = [("x-yard-start-by", "2000-01-01T00:00:00Z")]
    await vgw.request("POST", "/v1/chat/completions", body, long_past)
    first, second = vgw.engine.admissions
    assert first.submitted["start_by"] == 100 + 30
    assert first.submitted["allow_late"] is True
    # A moment long past lies far behind the engine clock's now.
    assert second.submitted["start_by"] < 100 - 700_000_000
    assert second.submitted["allow_late"] is False


async def test_backend_errors_pass_through_and_are_not_retried(gw: Gateway) -> None:
    response = await gw.client.post("/backends/music/status/500", content=b"x")
    assert response.status_code == 500
    assert response.json() == {"backend_status": 500}
    assert len(gw.upstream.requests) == 1
    (admission,) = gw.engine.admissions
    assert admission.reports == [("ok", "")]


async def test_plain_backend_path_is_forwarded_without_its_prefix(gw: Gateway) -> None:
    response = await gw.client.put("/backends/music/generate/song?len=3", content=b"\x00\x01")
    echo = _echo(response)
    assert (echo["method"], echo["target"]) == ("PUT", "/generate/song?len=3")
    assert gw.upstream.bodies == [b"\x00\x01"]
    assert gw.engine.admissions[0].backend == "music"
    encoded = await gw.client.get("/backends/music/a%20b%0D%0AX-Evil:%201")
    assert _echo(encoded)["target"] == "/a%20b%0D%0AX-Evil:%201"
    assert "x-evil" not in _headers(_echo(encoded))
    missing = await gw.client.get("/backends/nope/x")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "backend_not_found"


async def test_multipart_requests_are_routed_by_their_model_field(gw: Gateway) -> None:
    body = (
        b"--XyZ\r\n"
        b'Content-Disposition: form-data; name="file"; filename="model.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n"
        b'RIFF\x00\x00name="model"\r\n'
        b"--XyZ\r\n"
        b'Content-Disposition: form-data; name="model"\r\n\r\n'
        b"whisper-1\r\n"
        b"--XyZ--\r\n"
    )
    ctype = {"content-type": "multipart/form-data; boundary=XyZ"}
    response = await gw.client.post("/v1/audio/transcriptions", content=body, headers=ctype)
    assert response.status_code == 200
    assert gw.engine.admissions[0].backend == "whisper"
    assert gw.upstream.bodies == [body]
    no_model = await gw.client.post(
        "/v1/audio/transcriptions", files={"file": ("a.wav", b"x", "audio/wav")}
    )
    assert no_model.status_code == 400
    assert no_model.json()["error"]["code"] == "model_required"
    by_httpx = await gw.client.post(
        "/v1/audio/transcriptions",
        data={"model": "tiny"},
        files={"file": ("a.wav", b"x", "audio/wav")},
    )
    assert by_httpx.status_code == 200
    assert gw.engine.admissions[1].backend == "llm"


async def test_models_lists_every_configured_model_with_its_backend_state(gw: Gateway) -> None:
    response = await gw.client.get("/v1/models")
    data = response.json()
    assert data["object"] == "list"
    assert [(m["id"], m["backend"], m["state"]) for m in data["data"]] == [
        ("tiny", "llm", "ready"),
        ("tiny-alias", "llm", "ready"),
        ("whisper-1", "whisper", "ready"),
    ]
    one = await gw.client.get("/v1/models/whisper-1")
    assert one.json()["id"] == "whisper-1"
    assert (await gw.client.get("/v1/models/nope")).status_code == 404


async def test_an_unknown_model_path_says_which_model_was_meant(gw: Gateway) -> None:
    # The same answer as a request naming that model: the 404 says what to use.
    near = await gw.client.get("/v1/models/whisper-2")
    assert near.status_code == 404
    assert near.json()["error"] == {
        "message": "the model 'whisper-2' does not exist in this yard; did you mean "
        "'whisper-1'? GET /v1/models lists them",
        "type": "not_found_error",
        "code": "model_not_found",
        "param": None,
    }


async def test_a_refusal_that_names_the_field_at_fault_keeps_it_on_the_data_plane(
    gateway_factory: GatewayFactory,
) -> None:
    class Refusing:
        async def submit(self, request: object, *, rerun_safe: bool) -> dict[str, object]:
            raise Rejected(400, "invalid_value", "'n' must be 1 for a job", param="n")

    gw = await gateway_factory(jobs=Refusing())
    async with gw.client:
        refused = await gw.client.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [], "n": 2},
            headers={"prefer": "respond-async"},
        )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "n"
    assert refused.headers["x-should-retry"] == "false"


async def test_healthz_answers_once_serving(gw: Gateway) -> None:
    response = await gw.client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_stream_chunks_arrive_as_the_backend_sends_them(
    vgw: VirtualGateway[FakeEngine], autojump_clock: trio.testing.MockClock
) -> None:
    body = json.dumps({**CHAT, "stream": True, "chunks": 3, "interval": 0.3}).encode()
    t0 = trio.current_time()
    reply = await vgw.request("POST", "/v1/chat/completions", body)
    assert reply.complete
    assert reply.header("content-type") == ["text/event-stream"]
    # Once, though the backend sent its own.
    assert reply.header("x-accel-buffering") == ["no"]
    # Each event when the backend sent it: nothing held back until the end.
    times = [at - t0 for at, piece in reply.pieces if piece.startswith(b"data: ")]
    assert times[:3] == [0.0, 0.3, 0.6]
    assert vgw.engine.admissions[0].reports == [("ok", "")]


async def test_client_disconnect_mid_stream_cancels_upstream_and_frees_the_slot(
    vgw: VirtualGateway[FakeEngine],
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = json.dumps({**CHAT, "stream": True, "chunks": 1000, "interval": 0.05}).encode()
    stream = await vgw.open("POST", "/v1/chat/completions", body)
    first = await stream.receive_some(65536)
    assert first.startswith(b"HTTP/1.1 200")
    await trio.sleep(1)
    left = trio.current_time()
    await stream.aclose()
    (admission,) = vgw.engine.admissions
    await vgw.engine.wait_settled(admission)
    # The hang-up is seen at once; the backend, at its next write.
    assert trio.current_time() == left
    await vgw.upstream.wait_streams_closed(1)
    assert trio.current_time() == pytest.approx(left + 0.05)
    assert admission.cancelled
    assert admission.reports == []
    assert vgw.upstream.open_streams == 0


async def test_client_that_leaves_while_queued_gives_up_its_place(
    vgw: VirtualGateway[FakeEngine], autojump_clock: trio.testing.MockClock
) -> None:
    vgw.engine.hold.add("llm")
    stream = await vgw.open("POST", "/v1/chat/completions", json.dumps(CHAT).encode())
    await vgw.engine.wait_submitted(1)
    await trio.sleep(5)
    left = trio.current_time()
    await stream.aclose()
    (admission,) = vgw.engine.admissions
    await vgw.engine.wait_settled(admission)
    assert trio.current_time() == left
    assert admission.cancelled
    assert vgw.upstream.requests == []


async def test_upstream_lost_before_any_byte_is_reported_and_the_core_decides(
    gw: Gateway,
) -> None:
    response = await gw.client.post("/backends/music/cut-before", content=b"x")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "backend_failed"
    (admission,) = gw.engine.admissions
    assert [outcome for outcome, _ in admission.reports] == ["upstream_lost"]
    assert len(gw.upstream.requests) == 1


async def test_a_requeued_request_is_sent_again_when_the_core_says_so(gw: Gateway) -> None:
    gw.engine.lost = "requeue_once"
    response = await gw.client.post("/backends/music/cut-before", content=b"x")
    assert response.status_code == 502
    (admission,) = gw.engine.admissions
    assert [o for o, _ in admission.reports] == ["upstream_lost", "upstream_lost"]
    assert admission.dispatches == 2
    assert len(gw.upstream.requests) == 2


async def test_connection_cut_mid_response_ends_the_client_response_as_an_error(
    vgw: VirtualGateway[FakeEngine],
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = await vgw.request("POST", "/backends/music/cut-after")
    assert reply.status == 200
    # A cut response must not look complete.
    assert not reply.complete
    (admission,) = vgw.engine.admissions
    assert [o for o, _ in admission.reports] == ["error"]
    assert len(vgw.upstream.requests) == 1


async def test_unreachable_backend_is_reported_lost_then_failed(gw: Gateway) -> None:
    gw.engine.base_urls["llm"] = "http://127.0.0.1:1"
    response = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    (admission,) = gw.engine.admissions
    assert [o for o, _ in admission.reports] == ["upstream_lost"]


async def test_respond_async_without_a_job_service_is_501(gw: Gateway) -> None:
    response = await gw.client.post(
        "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
    )
    assert response.status_code == 501
    assert response.json()["error"]["code"] == "jobs_unavailable"
    assert gw.engine.admissions == []


class _Jobs:
    def __init__(self) -> None:
        self.submitted: list[tuple[object, bool]] = []

    async def submit(self, request: object, *, rerun_safe: bool) -> dict[str, object]:
        self.submitted.append((request, rerun_safe))
        return {"id": "job-1", "status": "queued"}


async def test_respond_async_hands_the_parsed_request_to_the_job_service(
    gateway_factory: GatewayFactory,
) -> None:
    jobs = _Jobs()
    gw = await gateway_factory(jobs=jobs)
    async with gw.client:
        response = await gw.client.post(
            "/v1/chat/completions?q=1",
            json=CHAT,
            headers={"prefer": "respond-async, rerun-safe", "x-yard-priority": "5"},
        )
    assert response.status_code == 202
    assert response.headers["location"] == "/v1/jobs/job-1"
    assert response.json() == {"id": "job-1", "status": "queued"}
    ((request, rerun_safe),) = jobs.submitted
    assert rerun_safe is True
    from yard.h1.upstream import ProxyRequest

    assert isinstance(request, ProxyRequest)
    assert (request.backend, request.priority, request.model) == ("llm", 5.0, "tiny")
    assert request.app == "local"  # the app's name: all forward() and jobs need
    assert request.target == b"/v1/chat/completions?q=1"
    assert all(name != b"prefer" for name, _ in request.headers)
    assert gw.engine.admissions == []


class _Heard:
    """Records what the gateway tells the metrics hook."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []
        self.changed = trio.Event()

    def __call__(
        self,
        *,
        model: str,
        backend: str,
        outcome: str,
        queued_s: float | None,
        latency_s: float | None,
    ) -> None:
        self.calls.append(
            {
                "model": model,
                "backend": backend,
                "outcome": outcome,
                "queued_s": queued_s,
                "latency_s": latency_s,
            }
        )
        self.changed.set()

    async def wait_calls(self, count: int) -> None:
        while len(self.calls) < count:
            self.changed = trio.Event()
            await self.changed.wait()


async def test_metrics_hook_hears_each_request_once_with_outcome_wait_and_latency(
    vgw: VirtualGateway[FakeEngine], autojump_clock: trio.testing.MockClock
) -> None:
    heard = _Heard()
    observed(vgw, heard)
    streamed = json.dumps({**CHAT, "stream": True, "chunks": 3, "interval": 0.25}).encode()
    assert (await vgw.request("POST", "/v1/chat/completions", streamed)).status == 200
    assert (await vgw.request("POST", "/backends/music/x", b"x")).status == 200
    vgw.engine.rejecting["whisper"] = Rejected(status=503, code="queue_full", message="full")
    whisper = json.dumps({"model": "whisper-1"}).encode()
    assert (await vgw.request("POST", "/v1/audio/transcriptions", whisper)).status == 503
    assert (await vgw.request("POST", "/backends/music/cut-before")).status == 502
    await heard.wait_calls(4)
    ok, plain, full, lost = heard.calls
    # The stream's three events, 0.25 s apart, then its end.
    assert ok == {
        "model": "tiny",
        "backend": "llm",
        "outcome": "ok",
        "queued_s": 0.0125,
        "latency_s": 0.5,
    }
    assert (plain["model"], plain["backend"], plain["outcome"]) == ("", "music", "ok")
    # Never dispatched: no wait and no latency to report.
    assert full == {
        "model": "whisper-1",
        "backend": "whisper",
        "outcome": "queue_full",
        "queued_s": None,
        "latency_s": None,
    }
    # Lost before any byte, then failed by the core: one call, the final code.
    assert (lost["outcome"], lost["queued_s"], lost["latency_s"]) == (
        "backend_failed",
        0.0125,
        None,
    )


async def test_metrics_hook_hears_a_cut_response_as_error_and_a_client_gone_as_cancelled(
    vgw: VirtualGateway[FakeEngine], autojump_clock: trio.testing.MockClock
) -> None:
    heard = _Heard()
    observed(vgw, heard)
    assert not (await vgw.request("POST", "/backends/music/cut-after")).complete
    await heard.wait_calls(1)
    body = json.dumps({**CHAT, "stream": True, "chunks": 1000, "interval": 0.05}).encode()
    stream = await vgw.open("POST", "/v1/chat/completions", body)
    assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200")
    await stream.aclose()
    await heard.wait_calls(2)
    cut, gone = heard.calls
    assert (cut["outcome"], cut["queued_s"]) == ("error", 0.0125)
    assert cut["latency_s"] is not None
    assert (gone["outcome"], gone["queued_s"], gone["latency_s"]) == ("cancelled", 0.0125, None)


async def test_every_proxied_request_counts_in_yard_requests_total(gw: Gateway) -> None:
    def count() -> float:
        labels = {"model": "tiny-alias", "backend": "llm", "outcome": "ok"}
        samples = [s for m in REQUESTS.collect() for s in m.samples]
        return sum(s.value for s in samples if s.name.endswith("_total") and s.labels == labels)

    before = count()
    await gw.client.post("/v1/chat/completions", json={**CHAT, "model": "tiny-alias"})
    await gw.client.post("/v1/chat/completions", json={**CHAT, "model": "tiny-alias"})
    assert count() == before + 2


# -- backends that lie ---------------------------------------------------------

OK_HEAD = b"HTTP/1.1 200 OK\r\n"


async def _scripted_gateway(gateway_factory: GatewayFactory, answer: bytes) -> Gateway:
    """A gateway whose ``llm`` backend answers every request with ``answer``."""
    gw = await gateway_factory()
    scripted = await gateway_factory.nursery.start(serve_scripted, Scripted(answer))
    gw.engine.base_urls["llm"] = scripted.base_url
    return gw


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            OK_HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n",
            id="chunked and a length",
        ),
        pytest.param(OK_HEAD + b"X-A: a\rb\r\nContent-Length: 2\r\n\r\nok", id="CR in a header"),
        pytest.param(OK_HEAD + b"X-A: a\x00b\r\nContent-Length: 2\r\n\r\nok", id="NUL in a header"),
        pytest.param(b"HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok", id="status below 100"),
        pytest.param(
            OK_HEAD + b"X-Big: " + b"a" * 100_000 + b"\r\nContent-Length: 2\r\n\r\nok",
            id="head over 64 KiB",
        ),
        pytest.param(
            OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", id="bad chunk with the head"
        ),
    ],
)
async def test_a_backend_answer_that_breaks_http_is_a_502_backend_failed(
    gateway_factory: GatewayFactory, answer: bytes
) -> None:
    gw = await _scripted_gateway(gateway_factory, answer)
    async with gw.client:
        response = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "backend_failed")
    assert "x-big" not in response.headers
    (admission,) = gw.engine.admissions
    assert admission.reports[0][0] == "upstream_lost"


async def test_a_body_shorter_than_its_length_is_a_clean_cut(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await _scripted_gateway(gateway_factory, OK_HEAD + b"Content-Length: 10\r\n\r\nshort")
    async with gw.client:
        with pytest.raises(httpx.RemoteProtocolError, match=r"complete message"):
            await gw.client.post("/v1/chat/completions", json=CHAT)
    await gw.engine.wait_settled(gw.engine.admissions[0])
    assert gw.engine.admissions[0].reports[0][0] == "error"


async def test_a_body_longer_than_its_length_is_cut_at_the_length(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await _scripted_gateway(gateway_factory, OK_HEAD + b"Content-Length: 2\r\n\r\nhello")
    async with gw.client:
        response = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert (response.status_code, response.content) == (200, b"he")
    assert response.headers["content-length"] == "2"


async def test_a_backend_cookie_named_like_yards_session_never_reaches_the_client(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await _scripted_gateway(
        gateway_factory,
        OK_HEAD + b"Set-Cookie: yard_admin=stolen; Path=/\r\nSet-Cookie: theirs=1\r\n"
        b"Set-Cookie:  Yard_Admin =x\r\nContent-Length: 2\r\n\r\nok",
    )
    async with gw.client:
        response = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.headers.get_list("set-cookie") == ["theirs=1"]


async def test_a_mistyped_openai_path_gets_yards_404_not_the_backends(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory()
    async with gw.client:
        typo = await gw.client.post("/v1/chat/completion", json=CHAT)
        other = await gw.client.post("/v1/vendor/thing", json=CHAT)
    assert typo.status_code == 404
    error = typo.json()["error"]
    assert error["code"] == "path_not_found"
    assert "did you mean /v1/chat/completions?" in error["message"]
    assert typo.headers["x-should-retry"] == "false"
    # A path that is no near miss of OpenAI's still goes to the model's backend.
    assert other.status_code == 200
    assert len(gw.engine.admissions) == 1


async def test_an_unknown_model_gets_a_did_you_mean_among_the_apps_own_models(
    gateway_factory: GatewayFactory,
) -> None:
    scoped = {
        "chat": AppConfig(
            name="chat", key="key-chat", default_priority=60.0, max_priority=80.0, models=("tiny",)
        )
    }
    gw = await gateway_factory(config=make_config(apps=scoped))
    key = {"authorization": "Bearer key-chat"}
    async with gw.client:
        near = await gw.client.post(
            "/v1/chat/completions", json={**CHAT, "model": "tinny"}, headers=key
        )
        hidden = await gw.client.post(
            "/v1/chat/completions", json={**CHAT, "model": "whisper-2"}, headers=key
        )
    assert near.status_code == 404
    assert "did you mean 'tiny'?" in near.json()["error"]["message"]
    # whisper-1 is outside the app's models: never suggested.
    assert hidden.json()["error"]["message"] == (
        "the model 'whisper-2' does not exist in this yard; GET /v1/models lists them"
    )

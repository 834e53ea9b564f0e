"""Bad framing and bad sizes from a client: each gets a clear 4xx in yard's
error shape, never a 500, while ``/healthz`` keeps answering."""

from __future__ import annotations

import pytest

from tests.edge.conftest import ADMIN, APP
from tests.edge.harness import (
    Yard,
    error_shape_ok,
    exchange,
    get,
    healthz_answers,
    post,
    request_bytes,
)

pytestmark = pytest.mark.slow

CHAT = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}]}'
MiB = 2**20


def _chunked(body: bytes, *, version: str = "1.1", headers: str = "") -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {APP['Authorization'].split()[1]}\r\n"
        f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n{headers}\r\n"
    ).encode() + body


def test_a_well_formed_chunked_request_is_proxied(yard: Yard) -> None:
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    with healthz_answers(yard):
        answer = exchange(yard, _chunked(body))
    assert answer.status == 200, answer.body[:300]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"zz\r\nhello\r\n0\r\n\r\n", id="size-not-hex"),
        pytest.param(b"5\nhello\r\n0\r\n\r\n", id="size-line-ends-in-lf-only"),
        pytest.param(b"3\r\nhello\r\n0\r\n\r\n", id="more-data-than-the-size"),
        pytest.param(b"ffffffffffffffffffff\r\nx\r\n0\r\n\r\n", id="size-overflows"),
    ],
)
def test_a_malformed_chunked_body_is_a_400(yard: Yard, body: bytes) -> None:
    with healthz_answers(yard):
        answer = exchange(yard, _chunked(body))
    assert answer.status == 400, (answer.status, answer.body[:300])
    assert answer.error_code() == "malformed_request"


def test_a_chunked_body_on_http_1_0_is_refused(yard: Yard) -> None:
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    with healthz_answers(yard):
        answer = exchange(yard, _chunked(body, version="1.0"))
    assert answer.status == 400, (answer.status, answer.body[:300])
    assert error_shape_ok(answer)


def test_transfer_encoding_with_content_length_is_refused(yard: Yard) -> None:
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    with healthz_answers(yard):
        answer = exchange(yard, _chunked(body, headers="Content-Length: 4\r\n"))
    assert answer.status == 400, (answer.status, answer.body[:300])


def test_two_different_content_lengths_are_refused(yard: Yard) -> None:
    data = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: %d\r\nContent-Length: 3\r\n\r\n%s" % (len(CHAT), CHAT)
    )
    answer = exchange(yard, data)
    assert answer.status == 400


def test_json_nested_deeper_than_any_parser_allows_is_a_400(yard: Yard) -> None:
    body = b'{"model":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with healthz_answers(yard):
        answer = post(yard, "/v1/chat/completions", body, headers=APP)
    assert answer.status == 400, (answer.status, answer.body[:300])
    assert error_shape_ok(answer)


def test_json_nested_1000_deep_before_the_model_is_a_clear_answer(yard: Yard) -> None:
    body = b'{"x":' + b"[" * 1000 + b"]" * 1000 + b',"model":"nope"}'
    answer = post(yard, "/v1/chat/completions", body, headers=APP)
    assert answer.status in (400, 404), (answer.status, answer.body[:300])
    assert error_shape_ok(answer)


def test_a_limit_of_5000_digits_is_a_400(yard: Yard) -> None:
    answer = get(yard, "/v1/jobs?limit=" + "9" * 5000, headers=APP)
    assert answer.status == 400, (answer.status, answer.body[:300])
    assert answer.error_code() == "invalid_limit"


@pytest.mark.parametrize("value", ["-1", "0", "abc", "1e3", "", "\u0661"])
def test_a_limit_that_is_not_a_small_whole_number_is_a_400(yard: Yard, value: str) -> None:
    answer = get(yard, "/v1/jobs?limit=" + value.encode().decode("latin-1"), headers=APP)
    assert answer.status == 400, (answer.status, answer.body[:300])


def test_a_60_mib_login_form_is_refused_without_freezing_yard(yard: Yard) -> None:
    form = b"a=b&" * (15 * MiB)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    with healthz_answers(yard):
        answer = post(yard, "/dashboard/login", form, headers=headers, timeout=60)
    assert answer.status == 413, (answer.status, answer.body[:300])


def test_a_60_mib_form_to_the_data_plane_does_not_freeze_yard(yard: Yard) -> None:
    form = b"a=b&" * (15 * MiB)
    headers = {**APP, "Content-Type": "application/x-www-form-urlencoded"}
    with healthz_answers(yard):
        answer = post(yard, "/v1/chat/completions", form, headers=headers, timeout=60)
    assert answer.status in (400, 413), (answer.status, answer.body[:300])
    assert error_shape_ok(answer)


def test_a_60_mib_json_body_does_not_freeze_yard(yard: Yard) -> None:
    count = 30 * MiB - 16
    body = b'{"pad":[' + b"0," * count + b'0],"model":"nope"}'
    headers = {**APP, "Content-Type": "application/json"}
    with healthz_answers(yard):
        answer = post(yard, "/v1/chat/completions", body, headers=headers, timeout=60)
    assert answer.status in (404, 413), (answer.status, answer.body[:300])
    assert error_shape_ok(answer)


def test_a_body_over_the_limit_is_refused_by_its_content_length(yard: Yard) -> None:
    data = request_bytes(
        "POST",
        "/v1/chat/completions",
        headers={**APP, "Content-Length": str(65 * MiB), "Content-Type": "application/json"},
    )
    with healthz_answers(yard):
        answer = exchange(yard, data)
    assert answer.status == 413
    assert answer.error_code() == "body_too_large"


def test_a_request_head_over_the_limit_is_a_431(yard: Yard) -> None:
    filler = {f"X-Filler-{i}": "f" * 100 for i in range(1000)}
    with healthz_answers(yard):
        answer = exchange(yard, request_bytes("GET", "/healthz", headers=filler))
    assert answer.status == 431


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        pytest.param({}, 401, "missing_api_key", id="no-key"),
        pytest.param({"Authorization": "Bearer wrong"}, 401, "invalid_api_key", id="wrong-key"),
        pytest.param({"Authorization": "Basic Zm9vOmJhcg=="}, 401, "invalid_api_key", id="basic"),
        pytest.param(ADMIN, 401, "invalid_api_key", id="admin-key-is-no-app-key"),
    ],
)
def test_the_data_plane_refuses_requests_without_an_app_key(
    yard: Yard, headers: dict[str, str], status: int, code: str
) -> None:
    answer = post(yard, "/v1/chat/completions", CHAT, headers=headers)
    assert answer.status == status, (answer.status, answer.body[:300])
    assert answer.error_code() == code


@pytest.mark.parametrize(
    "path", ["/admin/status", "/admin/backends/llm/unload", "/admin/profiles/llm"]
)
def test_the_admin_api_refuses_an_app_key(yard: Yard, path: str) -> None:
    method = {"/admin/status": "GET", "/admin/profiles/llm": "DELETE"}.get(path, "POST")
    answer = exchange(yard, request_bytes(method, path, headers=APP, body=b""))
    assert answer.status == 401
    assert error_shape_ok(answer)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Yard-Priority", "nan"),
        ("X-Yard-Priority", "1e999"),
        ("X-Yard-Start-Within", "-1"),
        ("X-Yard-Start-Within", "1e20"),
        ("X-Yard-Start-By", "tomorrow"),
        ("X-Yard-Start-By", "9999-12-31T23:59:59-23:59"),
        ("X-Yard-Allow-Late", "maybe"),
    ],
)
def test_a_bad_scheduling_header_is_a_400(yard: Yard, header: str, value: str) -> None:
    answer = post(yard, "/v1/chat/completions", CHAT, headers={**APP, header: value})
    assert answer.status == 400, (answer.status, answer.body[:300])
    assert error_shape_ok(answer)

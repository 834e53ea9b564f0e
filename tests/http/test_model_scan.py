"""Finding the model of a request: the same answer as parsing the whole body
(json.loads, parse_qs), at a cost the event loop can bear. Large bodies are
scanned, never parsed whole; the scanner is checked against json.loads and
parse_qs on generated bodies, cut into tiny windows so that every boundary
case is met."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.http.conftest import Gateway
from yard.errors import Rejected
from yard.http import model_scan
from yard.http.model_scan import model_of

FORM = b"application/x-www-form-urlencoded"
PADDING = 200 * 1024  # over the size read inline


def _outcome(read: Callable[[], str]) -> str:
    try:
        return read()
    except Rejected as exc:
        return f"error {exc.status} {exc.code}"


def _reference_json(body: bytes) -> str:
    """What model_of answered when it parsed every body with json.loads."""
    try:
        data = json.loads(body)
    except ValueError:
        return "error 400 invalid_json"
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not model:
        return "error 400 model_required"
    return model


def _reference_form(body: bytes) -> str:
    values = parse_qs(body.decode("utf-8", "replace")).get("model")
    return values[0] if values else "error 400 model_required"


@pytest.fixture
def big_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of what model_of hands json.loads and parse_qs."""
    sizes: list[int] = []
    loads, parse = json.loads, parse_qs

    def counted_loads(text: Any, **kwargs: Any) -> Any:
        sizes.append(len(text))
        return loads(text, **kwargs)

    def counted_parse(text: Any, **kwargs: Any) -> Any:
        sizes.append(len(text))
        return parse(text, **kwargs)

    monkeypatch.setattr(json, "loads", counted_loads)
    monkeypatch.setattr(model_scan, "parse_qs", counted_parse, raising=False)
    return sizes


def test_a_large_form_body_is_scanned_for_its_model_not_parsed_whole(
    big_calls: list[int],
) -> None:
    body = b"a=b&" * (PADDING // 4) + b"model=tiny&c=d"
    assert model_of("POST", FORM, body) == "tiny"
    assert all(size < 4096 for size in big_calls), big_calls


def test_a_large_json_body_is_scanned_for_its_model_not_parsed_whole(
    big_calls: list[int],
) -> None:
    message = b'{"role":"user","content":"hi","model":"nested"},'
    body = b'{"messages":[' + message * (PADDING // len(message)) + b'{}],"model":"tiny"}'
    assert model_of("POST", b"application/json", body) == "tiny"
    assert all(size < 4096 for size in big_calls), big_calls


async def test_the_gateway_scans_a_large_body_on_the_loop_in_turns(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not in a worker thread (there the scan held the GIL, and the loop
    # waited for it at each of its system calls), and not in one go: other
    # tasks run between the scan's steps.
    monkeypatch.setattr(model_scan, "_STEP", 4096)
    monkeypatch.setattr("yard.http.reader._TURN_S", 0.0)
    turns = 0
    scans: list[tuple[bool, int]] = []
    real = model_scan.model_steps

    def watched(method: str, content_type: bytes | None, body: bytes) -> model_scan.Steps[str]:
        before = turns
        model = yield from real(method, content_type, body)
        scans.append((threading.current_thread() is threading.main_thread(), turns - before))
        return model

    monkeypatch.setattr("yard.http.reader.model_steps", watched)

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(count_turns)
        for body in ({"model": "tiny"}, {"model": "tiny", "pad": "x" * PADDING}):
            response = await gw.client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200
        nursery.cancel_scope.cancel()
    # (The small body is read at once.) 200 KiB in 4 KiB steps, a turn for
    # the others after each.
    [(on_the_loop, others_ran)] = scans
    assert on_the_loop
    assert others_ran >= PADDING // 4096


@pytest.mark.parametrize("pad", [0, PADDING], ids=["inline", "scanned"])
def test_json_nested_1000_deep_is_refused_as_invalid_json(pad: int) -> None:
    body = b'{"model":"tiny","pad":"' + b"x" * pad + b'","deep":' + b"[" * 1000 + b"]" * 1000 + b"}"
    with pytest.raises(Rejected) as caught:
        model_of("POST", b"application/json", body)
    assert (caught.value.status, caught.value.code) == (400, "invalid_json")
    assert "nested too deeply" in caught.value.message


async def test_the_gateway_answers_json_nested_1000_deep_with_400(gw: Gateway) -> None:
    body = b'{"model":"tiny","deep":' + b"[" * 1000 + b"]" * 1000 + b"}"
    response = await gw.client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")
    assert gw.engine.admissions == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"messages":[{"model":"inner"}],"model":"outer"}', "outer"),
        (b'{"messages":[{"model":"inner"}]}', "error 400 model_required"),
        (b'{"text":"say \\"model\\": \\"no\\"","model":"yes"}', "yes"),
        (b'{"model":"first","model":"last"}', "last"),
        (b'{"model":"first","model":7}', "error 400 model_required"),
        (b'{"\\u006dodel":"escaped"}', "escaped"),
        (b'{"mode\\u006C":"escaped","x\\"model":"no"}', "escaped"),
        (b'{"model":"caf\\u00e9"}', "caf\u00e9"),
        (b'{"model":""}', "error 400 model_required"),
        (b'{"model":{"name":"x"}}', "error 400 model_required"),
        (b'["model","tiny"]', "error 400 model_required"),
        (b'\xef\xbb\xbf {"model":"bom"} ', "bom"),
        (b'{"model":"tiny"', "error 400 invalid_json"),
        (b'{"model":"tiny"} x', "error 400 invalid_json"),
        (b'{"model":"tiny","a":[}', "error 400 invalid_json"),
        (b'{"model":"tin', "error 400 invalid_json"),
        (b"not json", "error 400 invalid_json"),
    ],
)
def test_the_json_scanner_reads_the_top_level_model(body: bytes, expected: str) -> None:
    assert _outcome(lambda: model_scan._json_model(body)) == expected
    assert _reference_json(body) == expected


# -- differential ----------------------------------------------------------------

_KEYS = ["model", "messages", "content", "role", "stream", "x"]
_TEXT = st.sampled_from(
    ["tiny", "", 'say "model": no', "a\\b", "{[", "]}", "caf\u00e9", "\n", "model"]
)
_SCALARS = st.one_of(_TEXT, st.integers(-5, 5), st.booleans(), st.none(), st.floats(0, 2))
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(st.tuples(st.sampled_from(_KEYS), inner), max_size=3).map(dict),
    ),
    max_leaves=12,
)


def _key(name: str, escape: int) -> str:
    """``name`` as a JSON string; ``escape`` picks letters to write as \\u."""
    letters = [
        f"\\u{ord(char):04{'x' if i % 2 else 'X'}}" if escape >> i & 1 else char
        for i, char in enumerate(name)
    ]
    return '"' + "".join(letters) + '"'


@st.composite
def json_bodies(draw: st.DrawFn) -> bytes:
    members = draw(
        st.lists(
            st.tuples(st.sampled_from(_KEYS), st.integers(0, 31), _VALUES, st.booleans()),
            max_size=5,
        )
    )
    space = draw(st.sampled_from(["", " ", "\n  "]))
    text = "{" + space
    text += ("," + space).join(
        (_key(name, escape) if name == "model" else json.dumps(name))
        + space
        + ":"
        + space
        + json.dumps(value, ensure_ascii=ascii_only)
        for name, escape, value, ascii_only in members
    )
    return (text + space + "}").encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=json_bodies(), step=st.integers(1, 40))
def test_the_json_scanner_agrees_with_json_loads(body: bytes, step: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_scan, "_STEP", step)
        ours = _outcome(lambda: model_scan._json_model(body))
    assert ours == _reference_json(body), body


_FIELDS = st.sampled_from(
    [b"model", b"mod%65l", b"%6Dodel", b"MODEL", b"mode", b"a", b"xmodel", b"model%20", b""]
)
_FIELD_VALUES = st.sampled_from([b"tiny", b"", b"a+b", b"caf%C3%A9", b"%ZZ", b"x=y", b"\xff"])


@settings(max_examples=400, deadline=None)
@given(
    fields=st.lists(st.tuples(_FIELDS, st.sampled_from([b"=", b""]), _FIELD_VALUES), max_size=6),
    step=st.integers(1, 40),
)
def test_the_form_scanner_agrees_with_parse_qs(
    fields: list[tuple[bytes, bytes, bytes]], step: int
) -> None:
    body = b"&".join(name + eq + value for name, eq, value in fields)
    if body.lstrip().startswith(b"{"):
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_scan, "_STEP", step)
        ours = _outcome(lambda: model_of("POST", FORM, body))
    assert ours == _reference_form(body), body


def test_a_multipart_model_field_is_looked_for_among_the_first_100_parts() -> None:
    def form(before: int) -> bytes:
        part = b'--b\r\ncontent-disposition: form-data; name="x"\r\n\r\n1\r\n'
        model = b'--b\r\ncontent-disposition: form-data; name="model"\r\n\r\ntiny\r\n'
        return part * before + model + b"--b--\r\n"

    ctype = b"multipart/form-data; boundary=b"
    assert model_of("POST", ctype, form(99)) == "tiny"
    with pytest.raises(Rejected) as caught:
        model_of("POST", ctype, form(100))
    assert caught.value.code == "model_required"
    assert "first 100 parts" in caught.value.message


def test_an_empty_multipart_model_field_is_a_model_required_400() -> None:
    # It was routed as the model "" and answered 404 model_not_found.
    body = b'--b\r\ncontent-disposition: form-data; name="model"\r\n\r\n \r\n--b--\r\n'
    with pytest.raises(Rejected) as caught:
        model_of("POST", b"multipart/form-data; boundary=b", body)
    assert (caught.value.status, caught.value.code) == (400, "model_required")

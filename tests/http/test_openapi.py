"""The OpenAPI document (:mod:`yard.app.openapi`) stays true.

- Every route the control plane (Quart) and the gateway serve is in the
  document, and every path of the document is served, by the part it says.
- A running yard's answers (real backends, every route, happy paths and
  errors) validate against the document.
- A schemathesis run over the document against a running yard gets no 500.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import jsonschema_rs
import pytest
import schemathesis
import trio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.result import Ok

from tests.gateway.conftest import backend_toml, running_yard
from tests.http.conftest import make_config
from yard.app.openapi import OPENAI_ROUTES, PROXY_METHODS, document
from yard.app.web import Parts, create_control_app
from yard.engine import Engine
from yard.h1.asgi import Message, Scope
from yard.http.gateway import Gateway
from yard.testing.engine import FakeEngine

DOC = document()
_IGNORED_METHODS = {"HEAD", "OPTIONS"}
# Paths the gateway answers itself, before Quart.
_DATA_PLANE = {"/v1/models", "/v1/models/{model}", *OPENAI_ROUTES, "/backends/{backend}/{path}"}


def _parts() -> Parts:
    return Parts(
        config=make_config(),
        engine=cast(Engine, FakeEngine()),
        started_at=1_700_000_000.0,
    )


def _control_routes() -> set[tuple[str, str]]:
    app = create_control_app(_parts())
    routes = set()
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in set(rule.methods or ()) - _IGNORED_METHODS:
            routes.add((path, method.lower()))
    return routes


def _documented() -> set[tuple[str, str]]:
    methods = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
    return {
        (path, method)
        for path, item in DOC["paths"].items()
        for method in item
        if method in methods
    }


def test_every_control_plane_route_is_documented_and_every_documented_one_is_served() -> None:
    control = _control_routes()
    documented = _documented()
    data_plane = {(p, m) for p, m in documented if p in _DATA_PLANE}
    assert control - documented == set(), "routes missing from the document"
    assert documented - data_plane - control == set(), "documented but not served"


def test_the_openai_routes_models_and_backends_are_documented_as_the_data_plane() -> None:
    paths = DOC["paths"]
    for route in OPENAI_ROUTES:
        assert set(paths[route]) == {"post"}
        assert "202" in paths[route]["post"]["responses"]
    assert set(paths["/backends/{backend}/{path}"]) == {"parameters", *PROXY_METHODS}
    assert set(paths["/v1/models"]) == {"get"}


async def _routed_to_control(path: str, method: str) -> bool:
    """Whether the gateway hands ``method path`` to the control plane."""
    reached: list[str] = []

    async def control(scope: Scope, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        return None

    scope: Scope = {
        "type": "http",
        "method": method.upper(),
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [],
    }
    parts = _parts()
    gateway = Gateway(control, config=parts.config, engine=parts.engine, pool=parts.pool)
    await gateway(scope, receive, send)
    return bool(reached)


async def test_each_documented_path_is_served_by_the_part_the_document_says() -> None:
    for path, method in sorted(_documented()):
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        to_control = await _routed_to_control(concrete, method)
        assert to_control == (path not in _DATA_PLANE), (method, path)


def test_every_reference_in_the_document_resolves() -> None:
    text = json.dumps(DOC)
    names = set(re.findall(r'"#/components/schemas/([^"]+)"', text))
    assert names <= set(DOC["components"]["schemas"])
    assert DOC["openapi"].startswith("3.1")


def test_the_batch_routes_that_refuse_the_admin_key_say_so_beside_the_key_errors() -> None:
    for path in ("/v1/files", "/v1/batches"):
        forbidden = DOC["paths"][path]["post"]["responses"]["403"]["description"]
        assert "admin_cannot_submit" in forbidden
        assert "refused by who or where" in forbidden


def test_a_routes_own_400_and_403_keep_the_edges_causes_beside_them() -> None:
    # A route that answers 400 or 403 itself can still get the edge's 400
    # (malformed HTTP) and 403 (Host, cross-origin) before it runs.
    mixed = 0
    for item in DOC["paths"].values():
        for name, operation in item.items():
            if name == "parameters":
                continue
            for status, code in (("400", "malformed_request"), ("403", "host_not_allowed")):
                assert code in operation["responses"][status]["description"]
            mixed += "refused by who or where" in operation["responses"]["403"]["description"]
    assert mixed > 0


# -- a running yard's answers validate against the document ---------------------


def _template(path: str) -> str:
    """The document's path template that ``path`` matches (literal first)."""
    templates: list[str] = list(DOC["paths"])
    candidates = sorted(templates, key=lambda t: (t.count("{"), -len(t)))
    for template in candidates:
        pattern = re.escape(template)
        pattern = pattern.replace(r"\{path\}", ".+")
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", pattern)
        if re.fullmatch(pattern, path):
            return template
    raise AssertionError(f"{path} matches no path of the document")


def check_answer(method: str, response: httpx.Response) -> None:
    """Assert ``response`` is what the document says ``method`` on its path answers."""
    template = _template(response.request.url.path)
    operation = DOC["paths"][template][method.lower()]
    responses = operation["responses"]
    described = responses.get(str(response.status_code), responses.get("default"))
    assert described is not None, f"{method} {template}: {response.status_code} is undocumented"
    content = described.get("content")
    if not content:
        return
    media = response.headers.get("content-type", "").split(";")[0].strip()
    assert media in content, f"{method} {template}: {media!r} is not one of {list(content)}"
    schema = content[media].get("schema")
    if media == "application/json" and schema is not None:
        validator = jsonschema_rs.Draft202012Validator({**schema, "components": DOC["components"]})
        validator.validate(response.json())


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.slow
async def test_a_running_yards_answers_validate_against_the_document(tmp_path: Path) -> None:
    body = backend_toml("llm", models=("tiny",))
    with trio.fail_after(60):
        async with running_yard(tmp_path, body) as runtime:
            client = httpx.AsyncClient(base_url=runtime.urls[0], timeout=30)
            async with client:
                checked = 0

                async def call(method: str, path: str, **kwargs: Any) -> httpx.Response:
                    nonlocal checked
                    response = await client.request(method, path, **kwargs)
                    check_answer(method, response)
                    checked += 1
                    return response

                assert (await call("GET", "/healthz")).status_code == 200
                assert (await call("GET", "/openapi.json")).json() == DOC
                assert (await call("GET", "/metrics")).status_code == 200
                assert (await call("POST", "/v1/chat/completions", json=CHAT)).status_code == 200
                assert (await call("GET", "/v1/models")).status_code == 200
                assert (await call("GET", "/v1/models/tiny")).status_code == 200
                assert (await call("GET", "/v1/models/nope")).status_code == 404
                nope = {**CHAT, "model": "nope"}
                assert (await call("POST", "/v1/chat/completions", json=nope)).status_code == 404
                bad = await call("POST", "/v1/embeddings", content=b"{")
                assert bad.status_code == 400
                job = await call(
                    "POST", "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
                )
                assert job.status_code == 202
                location = job.headers["location"]
                assert (await call("GET", location, params={"wait": "30"})).status_code == 200
                result = await call("GET", location + "/result", params={"wait": "30"})
                assert result.status_code == 200
                assert (await call("DELETE", location)).status_code == 409
                listed = await call("GET", "/v1/jobs", params={"status": "succeeded"})
                assert listed.json()["data"]
                assert (await call("GET", "/v1/jobs", params={"limit": "0"})).status_code == 400
                assert (await call("GET", "/v1/jobs/nope")).status_code == 404
                assert (await call("GET", "/admin/status")).status_code == 200
                assert (await call("POST", "/admin/backends/llm/pin")).status_code == 202
                assert (await call("POST", "/admin/backends/llm/bogus")).status_code == 404
                assert (await call("POST", "/admin/backends/nope/load")).status_code == 404
                assert (await call("DELETE", "/admin/profiles/nope")).status_code == 404
                assert (await call("GET", "/backends/llm/anything")).status_code == 200
                assert (await call("GET", "/backends/nope/x")).status_code == 404
                assert (await call("GET", "/dashboard")).status_code == 200
                login = await call("POST", "/dashboard/login", data={"key": "x"})
                assert login.status_code == 303
                assert (await call("POST", "/dashboard/logout")).status_code == 303
                rebound = await call("GET", "/v1/jobs", headers={"host": "rebind.example"})
                assert rebound.status_code == 403
                assert (await call("DELETE", location + "/result")).status_code == 200
                static = await call("GET", "/dashboard/static/dashboard.js")
                assert static.status_code == 200
    assert checked >= 29


# -- schemathesis: no 500 from yard -------------------------------------------------

FUZZ_EXAMPLES = 12
"""Examples per operation and mode: 44 operations, valid and invalid input,
about 1,000 requests (20 s on two quiet cores, 35 s at a load average of 17)."""
_MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
# Endless by design (server-sent events that follow a log or the dashboard).
_STREAMS = {("GET", "/dashboard/events"), ("GET", "/admin/backends/{name}/log")}


@pytest.fixture(scope="module")
def fuzzed_yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``yard serve`` on loopback (no keys: every route is open to
    loopback) with the test backend serving ``tiny``; its URL."""
    from tests.edge.harness import echo_toml, start_yard

    yard = start_yard(tmp_path_factory.mktemp("fuzz"), echo_toml())
    try:
        yield yard.url
    finally:
        yard.stop()


@pytest.mark.slow
def test_schemathesis_finds_no_500_anywhere_in_the_document(fuzzed_yard: str) -> None:
    schema = schemathesis.openapi.from_dict(document())
    seen: dict[int, int] = {}
    durable: dict[int, int] = {}  # the files, batches and announcements routes
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # schemathesis read every operation
        operations.append(result.ok())
    for operation, mode in itertools.product(operations, _MODES):
        if (operation.method.upper(), operation.path) in _STREAMS:
            continue

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Any) -> None:
            response = case.call(base_url=fuzzed_yard, timeout=10)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            if case.path.startswith(("/v1/files", "/v1/batches", "/v1/announcements")):
                durable[response.status_code] = durable.get(response.status_code, 0) + 1
            if response.status_code == 500:
                failures.append(f"{case.method} {case.formatted_path}: {response.text[:200]}")

        try:
            fuzz()
        except Unsatisfiable:
            # Nothing about it can be made invalid (no parameters, no body).
            assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
    assert sum(seen.values()) > 500, seen
    assert not failures, failures
    # The durable routes were reached and served (not 501: the job store is on).
    assert sum(durable.values()) > 100 and 501 not in durable, durable


def _unended_after(client: httpx.Client, seconds: float) -> list[str]:
    """The batches not ended once every batch has (or ``seconds`` passed)."""
    until = time.monotonic() + seconds
    while True:
        left = _ended(client)
        if not left or time.monotonic() >= until:
            return left
        time.sleep(0.2)


def _ended(client: httpx.Client) -> list[str]:
    """The status of every batch that has not ended."""
    batches = client.get("/v1/batches", params={"limit": "100"}).json()["data"]
    ended = ("completed", "failed", "expired", "cancelled")
    return [b["status"] for b in batches if b["status"] not in ended]


@pytest.mark.slow
def test_bad_input_to_files_batches_and_announcements_gets_no_500_and_every_batch_ends(
    fuzzed_yard: str,
) -> None:
    # Issue 24 cases 10 and 11, against a real yard.
    def line(custom_id: str, body: str = '{"model": "tiny"}') -> bytes:
        return (
            f'{{"custom_id": "{custom_id}", "method": "POST", "url": "/v1/chat/completions", '
            f'"body": {body}}}\n'
        ).encode()

    inputs = {
        "surrogate": line("ok") + line("\\ud800"),
        "deep": line("a", "[" * 100_000 + "]" * 100_000),
        "fine": line("a") + line("b"),
        "bad-utf8": b'{"custom_id": "\xff"}\n',
    }
    statuses: list[int] = []
    with httpx.Client(base_url=fuzzed_yard, timeout=30) as client:

        def seen(response: httpx.Response) -> httpx.Response:
            statuses.append(response.status_code)
            return response

        batch_ids = []
        for name, content in inputs.items():
            uploaded = seen(
                client.post(
                    "/v1/files",
                    files={"file": (f"{name}.jsonl", content)},
                    data={"purpose": "batch"},
                )
            )
            created = seen(
                client.post(
                    "/v1/batches",
                    json={
                        "input_file_id": uploaded.json()["id"],
                        "endpoint": "/v1/chat/completions",
                        "completion_window": "24h",
                    },
                )
            )
            batch_ids.append(created.json()["id"])
        deep = b"[" * 20_000 + b"]" * 20_000
        for path in ("/v1/announcements", "/v1/batches", "/v1/chat/completions"):
            answer = seen(
                client.post(path, content=deep, headers={"content-type": "application/json"})
            )
            assert answer.status_code == 400, (path, answer.text)
            assert answer.json()["error"]["code"] == "invalid_json"
        empty_model = seen(
            client.post(
                "/v1/audio/transcriptions",
                files={"file": ("a.wav", b"RIFF")},
                data={"model": ""},
            )
        )
        assert (empty_model.status_code, empty_model.json()["error"]["code"]) == (
            400,
            "model_required",
        )
        left = _unended_after(client, 60)
        surrogate = client.get(f"/v1/batches/{batch_ids[0]}").json()
    assert 500 not in statuses, statuses
    assert left == []  # every batch of this yard ended, the fuzzer's included
    assert surrogate["status"] == "failed"
    assert surrogate["errors"]["data"][0]["param"] == "custom_id"

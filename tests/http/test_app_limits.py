"""A request the engine refuses at submit (an app past its ``max_queued``)
gets the engine's 429 with Retry-After, synchronous or as a job, and the
metrics hook hears it."""

from __future__ import annotations

from tests.http.conftest import GatewayFactory
from yard.errors import Rejected

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
FULL = Rejected(
    429,
    "app_queue_full",
    "app 'local' already has 2 requests waiting, the most [apps.local] max_queued = 2 allows",
    retry_after_s=2.5,
)


class _Heard:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str, object]] = []

    def __call__(self, *, model: str, backend: str, outcome: str, **_: object) -> None:
        self.outcomes.append((model, backend, outcome))


class _Jobs:
    async def submit(self, request: object, *, rerun_safe: bool) -> dict[str, object]:
        raise FULL


async def test_a_refused_submit_is_429_with_retry_after(gateway_factory: GatewayFactory) -> None:
    heard = _Heard()
    gw = await gateway_factory(observe=heard, jobs=_Jobs())
    gw.engine.refuse = FULL
    async with gw.client:
        sync = await gw.client.post("/v1/chat/completions", json=CHAT)
        job = await gw.client.post(
            "/v1/chat/completions", json=CHAT, headers={"prefer": "respond-async"}
        )
    for response in (sync, job):
        assert response.status_code == 429
        assert response.headers["retry-after"] == "3"
        error = response.json()["error"]
        assert (error["code"], error["message"]) == ("app_queue_full", FULL.message)
    assert heard.outcomes == [("tiny", "llm", "app_queue_full")]
    assert gw.upstream.bodies == []

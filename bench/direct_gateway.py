"""yard's HTTP side alone, for profiling the proxy: the real gateway app on
yard's own HTTP server, with an engine stand-in that dispatches every request at once to
one upstream (no scheduler, no backend processes).

``python -m bench.direct_gateway --upstream http://127.0.0.1:PORT --port 0``
prints ``listening on http://HOST:PORT`` once serving. The full benchmark
measures the real ``yard serve`` instead; this one isolates the HTTP layer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio

from yard.app.web import Parts, create_app, serve_app
from yard.config import BackendConfig, Config, ServerConfig
from yard.core.spec import SchedulerConfig
from yard.engine import Assignment, Engine


class _Admission:
    """An admission dispatched at once (as on an idle engine): what
    :func:`yard.admission.run_turn` and the gateway read of one."""

    __slots__ = ("assignment", "queued_s", "request_id", "state")

    def __init__(self, request_id: str, base_url: str) -> None:
        self.request_id = request_id
        self.queued_s = 0.0
        self.state = "dispatched"
        self.assignment = Assignment(request_id=request_id, backend="bench", base_url=base_url)

    async def wait_dispatched(self) -> Assignment:
        return self.assignment

    async def wait_verdict(self) -> bool:
        return False

    def report(self, outcome: str = "ok", detail: str = "") -> None:
        pass

    def cancel(self) -> None:
        pass


class _ImmediateEngine:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def now(self) -> float:
        return trio.current_time()

    def submit(self, **kwargs: Any) -> _Admission:
        return _Admission(kwargs["request_id"], self.base_url)

    def snapshot(self, limit: int = 200) -> Any:
        return SimpleNamespace(backends=[SimpleNamespace(name="bench", state="ready")])


async def _serve(upstream: str, host: str, port: int) -> None:
    config = Config(
        path=Path("bench.toml"),
        server=ServerConfig(),
        scheduler=SchedulerConfig(),
        devices={},
        apps={},
        backends={
            "bench": BackendConfig(name="bench", models=("bench",), command=("true",), api="openai")
        },
    )
    parts = Parts(config=config, engine=cast(Engine, _ImmediateEngine(upstream)))
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve_app, create_app(parts), host, port)
        print(f"listening on {binds[0]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.direct_gateway")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        trio.run(_serve, args.upstream, args.host, args.port)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

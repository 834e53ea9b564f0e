"""Worst-case warm-ups: requests that drive a server to its largest footprint.

A profile is only as good as the load it was measured under. For llama.cpp's
``llama-server`` the worst case is a prompt that fills a slot's whole context:
the KV cache is allocated at start, but the compute buffers' pages are only
touched by the largest batches. A backend's configured ``warmup`` request
comes first; a measured first load (the supervisor) and ``yard probe`` then
add :func:`fill_llama_context` as the backend's ``warmup.fill_context`` says
(``"auto"``: when :func:`looks_like_llama_server`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx


@dataclass(frozen=True, slots=True, kw_only=True)
class FillProgress:
    """How far a context fill is: prompt tokens processed of ``total``, and
    the server's own time on them (llama-server's ``prompt_progress``)."""

    processed: int
    total: int
    elapsed_s: float

    @property
    def percent(self) -> int:
        return 100 * min(self.processed, self.total) // max(1, self.total)

    def describe(self) -> str:
        """``"warm-up 40 % (3,277 of 8,192 tokens, 51 s)"``."""
        return (
            f"warm-up {self.percent} % ({self.processed:,} of {self.total:,} tokens, "
            f"{self.elapsed_s:.0f} s)"
        )


def looks_like_llama_server(argv: Sequence[str]) -> bool:
    """Whether a backend command runs llama.cpp's server (directly, through
    ``python -m yard.demo.llama_server`` or ``yard.demo.xllama_server``, or
    as ``{llama_server}``, :mod:`yard.config.programs`)."""
    wrappers = ("yard.demo.llama_server", "yard.demo.xllama_server", "{llama_server}")
    return any("llama-server" in arg.rsplit("/", 1)[-1] or arg in wrappers for arg in argv)


async def fill_llama_context(
    base_url: str, on_progress: Callable[[FillProgress], None] | None = None
) -> None:
    """Send one completion whose prompt fills a slot's context (``n_ctx`` from
    ``/props``, less a few tokens for the answer), built from the server's own
    tokenizer so it works with any vocabulary. Raises ``httpx.HTTPError`` if
    the server refuses. The caller bounds the time.

    ``on_progress``: called as the server reports the prompt's progress (it
    streams the answer with ``return_progress``; a server too old to report
    any just answers, and ``on_progress`` is not called)."""
    async with httpx.AsyncClient(
        base_url=base_url, trust_env=False, timeout=httpx.Timeout(None)
    ) as client:
        props = (await client.get("/props")).raise_for_status().json()
        settings = props.get("default_generation_settings") or {}
        n_ctx = int(settings.get("n_ctx") or props.get("n_ctx") or 0)
        if n_ctx <= 0:
            raise httpx.HTTPError(f"{base_url}/props gives no n_ctx: {props!r:.200}")
        tokens = (
            (await client.post("/tokenize", json={"content": " hello world"}))
            .raise_for_status()
            .json()["tokens"]
        )
        if not tokens:
            raise httpx.HTTPError(f"{base_url}/tokenize gave no tokens")
        n_prompt = max(1, n_ctx - 8)
        prompt = (list(tokens) * (n_prompt // len(tokens) + 1))[:n_prompt]
        body = {"prompt": prompt, "n_predict": 4, "cache_prompt": False, "temperature": 0}
        if on_progress is None:
            (await client.post("/completion", json=body)).raise_for_status()
            return
        stream = {**body, "stream": True, "return_progress": True}
        async with client.stream("POST", "/completion", json=stream) as response:
            if response.is_error:
                await response.aread()
                response.raise_for_status()
            async for line in response.aiter_lines():
                progress = _progress(line)
                if progress is not None:
                    on_progress(progress)


def _progress(line: str) -> FillProgress | None:
    """The ``prompt_progress`` of one server-sent event line, if it has one."""
    if not line.startswith("data: "):
        return None
    try:
        event = json.loads(line[6:])
        figures = event["prompt_progress"]
        return FillProgress(
            processed=int(figures["processed"]),
            total=int(figures["total"]),
            elapsed_s=float(figures.get("time_ms", 0)) / 1000,
        )
    except (ValueError, KeyError, TypeError):
        return None

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

from collections.abc import Sequence

import httpx


def looks_like_llama_server(argv: Sequence[str]) -> bool:
    """Whether a backend command runs llama.cpp's server (directly, or through
    ``python -m yard.demo.llama_server``)."""
    return any(
        "llama-server" in arg.rsplit("/", 1)[-1] or arg == "yard.demo.llama_server" for arg in argv
    )


async def fill_llama_context(base_url: str) -> None:
    """Send one completion whose prompt fills a slot's context (``n_ctx`` from
    ``/props``, less a few tokens for the answer), built from the server's own
    tokenizer so it works with any vocabulary. Raises ``httpx.HTTPError`` if
    the server refuses. The caller bounds the time."""
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
        response = await client.post(
            "/completion",
            json={"prompt": prompt, "n_predict": 4, "cache_prompt": False, "temperature": 0},
        )
        response.raise_for_status()

"""Readiness: when a started backend may take requests.

A backend is ready when its health path answers 200 (a 503 "Loading model"
is not ready) and its warm-up request, if any, succeeded. On a measured first
load of a llama-server backend (:func:`fills_context`) one more request fills
a slot's whole context before it is ready, so that the profile taken during
the load is the worst case, not the footprint of an idle server.

Each step here runs until it is done or fails; the caller
(:meth:`yard.supervisor.ManagedProcess.wait_ready`) watches the process exit
and bounds the whole wait.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httpx
import trio

from yard.config import BackendConfig, WarmupConfig
from yard.memory.warmup import FillProgress, fill_llama_context, looks_like_llama_server
from yard.ports import Took

HEALTH_POLL_S = 0.1
"""Pause between two health checks."""

HEALTH_ATTEMPT_S = 2.0
"""Longest one health check may take before it is tried again."""

EXIT_CHECK_S = 1.0
"""After a failed step, how long to wait to see whether the process died under it."""


PROPS_WAIT_S = 2.0
"""Longest the read-back of ``/props`` may take once a backend is ready."""


async def read_took(base_url: str) -> Took | None:
    """What a llama-server took (``GET /props``: a slot's ``n_ctx``,
    ``total_slots``), None where the server has no such page or it says
    nothing usable (another server, an old llama-server)."""
    with trio.move_on_after(PROPS_WAIT_S):
        try:
            async with httpx.AsyncClient(
                base_url=base_url, trust_env=False, timeout=httpx.Timeout(PROPS_WAIT_S)
            ) as client:
                response = await client.get("/props")
            if response.status_code != 200:
                return None
            props = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(props, dict):
            return None
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        slots = props.get("total_slots")
        took = Took(
            context=n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None,
            slots=slots if isinstance(slots, int) and slots > 0 else None,
        )
        return took if took.context is not None or took.slots is not None else None
    return None


class WarmupFailed(Exception):
    """The warm-up (or a context fill asked for explicitly) failed; the
    message says what was sent and what came back."""


def fills_context(backend: BackendConfig, argv: Sequence[str], *, measure: bool) -> bool:
    """Whether a launch of ``backend`` as ``argv`` gets
    :func:`yard.memory.warmup.fill_llama_context` after its warm-up: only a
    measured load, and then as ``warmup.fill_context`` says (``"auto"``: when
    ``argv`` looks like llama-server)."""
    if not measure:
        return False
    if backend.fill_context == "auto":
        return looks_like_llama_server(argv)
    return backend.fill_context


async def poll_health(base_url: str, health_path: str) -> None:
    """Return once ``GET health_path`` answers 200 (polled every
    :data:`HEALTH_POLL_S`). Never returns for a backend that never does."""
    async with httpx.AsyncClient(
        base_url=base_url, trust_env=False, timeout=httpx.Timeout(5.0)
    ) as client:
        while True:
            # One attempt may not hang the loop: a backend that accepts and
            # never answers is polled again (the caller's timeout ends it).
            with trio.move_on_after(HEALTH_ATTEMPT_S):
                try:
                    response = await client.get(health_path)
                except httpx.HTTPError:
                    pass
                else:
                    if response.status_code == 200:
                        return
            await trio.sleep(HEALTH_POLL_S)


async def warm_up(name: str, base_url: str, warmup: WarmupConfig | None) -> None:
    """Send the warm-up request (if any); :class:`WarmupFailed` unless it
    answers 2xx."""
    if warmup is None:
        return
    async with httpx.AsyncClient(
        base_url=base_url, trust_env=False, timeout=httpx.Timeout(None)
    ) as client:
        try:
            response = await client.request(
                warmup.method,
                warmup.path,
                json=warmup.json if warmup.json is not None else None,
            )
        except httpx.HTTPError as exc:
            raise WarmupFailed(f"{name}: warm-up {warmup.path} failed: {exc!r}") from exc
        if not 200 <= response.status_code < 300:
            raise WarmupFailed(
                f"{name}: warm-up {warmup.method} {warmup.path} answered "
                f"{response.status_code}: {response.text[:300]}"
            )


async def fill_context(
    config: BackendConfig,
    base_url: str,
    process: trio.Process,
    note: Callable[[str], None],
    on_progress: Callable[[FillProgress], None] | None = None,
) -> None:
    """Fill a slot's context (the worst case of a measured load), saying so
    through ``note`` (the backend's log), with each progress report the
    server sends (also handed to ``on_progress``). With ``fill_context =
    true`` a failure is :class:`WarmupFailed`; with ``"auto"`` (guessed from
    the command) the backend still starts, unless it died under the fill."""
    note("[yard] measured first load: filling a slot's context (the worst case)")

    def progress(figures: FillProgress) -> None:
        note(f"[yard] {figures.describe()}")
        if on_progress is not None:
            on_progress(figures)

    try:
        await fill_llama_context(base_url, progress)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        if config.fill_context is True:
            raise WarmupFailed(f"{config.name}: context fill failed: {exc!r}") from exc
        # "auto" guessed from the command: a server without /props or
        # /tokenize still starts, with a profile that may be short of the
        # worst case. One that died under the fill is reported as dead.
        with trio.move_on_after(EXIT_CHECK_S):
            await process.wait()
        if process.poll() is not None:
            raise WarmupFailed(f"{config.name}: exited during the context fill") from exc
        note(
            f"[yard] context fill failed ({exc!r}); the measured profile may be short "
            "of the worst case (set warmup.fill_context = false to skip it)"
        )
    else:
        note("[yard] context filled")

"""The admin API: ``/admin/...``, for the operator (the admin key).

- ``GET /admin/status``: everything the dashboard shows, as JSON.
- ``POST /admin/backends/NAME/load|unload|pin|unpin``: asks the scheduler
  (it decides when: a load waits for memory, an unload for the backend's
  requests to finish). Answers 202 with the backend's state at that moment.
  For a backend with several instances (docs/instances.md) NAME stands for all
  of them: ``unload``, ``pin`` and ``unpin`` act on every instance they change,
  ``load`` loads the first instance not loaded
  (:func:`yard.core.instances.admin_targets`); the answer lists the instances
  acted on (``instances``) and says why (``detail``), 200 with ``accepted:
  false`` when there is nothing to do. ``NAME@2`` is one instance, ``NAME@1``
  the first alone.
- ``GET /admin/backends/NAME/log``: the backend's log as server-sent events,
  the lines kept so far, then new lines as they come.
- ``DELETE /admin/profiles/NAME``: forget the stored profile, so that the
  next load is measured again, alone on its devices.

Errors use the OpenAI error shape. Every route needs the admin key (see
:mod:`yard.observe.auth`).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable, Sequence

import trio
from quart import Blueprint, Response

from yard.core.events import AdminForgetProfile, AdminLoad, AdminPin, AdminUnload, Event
from yard.core.instances import admin_targets
from yard.h1.errors import error_body
from yard.observe.state import Observer, current_observer

blueprint = Blueprint("yard_admin", __name__, url_prefix="/admin")

LOG_POLL_S = 0.5
"""How often the log tail looks for new lines."""


def json_error(
    status: int, code: str, message: str, *, retry_after_s: float | None = None
) -> Response:
    """An error answer in the OpenAI shape (``Retry-After`` when given)."""
    headers = {"WWW-Authenticate": 'Bearer realm="yard admin"'} if status == 401 else {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return Response(error_body(status, code, message), status, headers, "application/json")


def json_response(payload: object, status: int = 200) -> Response:
    return Response(json.dumps(payload), status, content_type="application/json")


@blueprint.before_request
async def require_admin() -> Response | None:
    refusal = current_observer().refusal()
    if refusal is None:
        return None
    return json_error(
        refusal.status, refusal.code, refusal.message, retry_after_s=refusal.retry_after_s
    )


@blueprint.get("/status")
async def status() -> Response:
    """The status document (:func:`yard.observe.report.build_status`)."""
    return json_response(current_observer().status())


@blueprint.get("/timeline")
async def timeline() -> Response:
    """The dashboard's timeline as data (:func:`yard.observe.timeline.build`):
    per device and backend, the last hour's loading, loaded, serving and
    stopping spans, and the announced windows and held work ahead."""
    return json_response(current_observer().timeline())


def _backend_state(observer: Observer, name: str) -> dict[str, object] | None:
    for view in observer.engine.snapshot(limit=0).backends:
        if view.name == name:
            return {"backend": name, "state": view.state, "pinned": view.pinned}
    return None


def _unknown_backend(name: str) -> Response:
    return json_error(404, "backend_not_found", f"no backend is called {name!r}")


_ACTIONS: dict[str, Callable[[str], Event]] = {
    "load": lambda name: AdminLoad(backend=name),
    "unload": lambda name: AdminUnload(backend=name),
    "pin": lambda name: AdminPin(backend=name, pinned=True),
    "unpin": lambda name: AdminPin(backend=name, pinned=False),
}


@blueprint.post("/backends/<name>/<action>")
async def backend_action(name: str, action: str) -> Response:
    """Ask the scheduler to load, unload, pin or unpin a backend (or the
    instances of one, see the module's docstring)."""
    observer = current_observer()
    make = _ACTIONS.get(action)
    if make is None:
        return json_error(
            404, "unknown_action", f"{action!r} is not an action; use load, unload, pin or unpin"
        )
    views = observer.engine.snapshot(limit=0).backends
    targets = admin_targets(action, name, views)
    if targets is None:
        return _unknown_backend(name)
    states = {v.name: {"backend": v.name, "state": v.state, "pinned": v.pinned} for v in views}
    for target in targets.names:
        observer.engine.send(make(target))
    payload: dict[str, object] = {**states[targets.backend], "action": action}
    if not targets.group:
        return json_response({**payload, "accepted": True}, 202)
    acted = [states[target] for target in targets.names]
    payload.update(accepted=bool(acted), instances=acted, detail=targets.detail)
    return json_response(payload, 202 if acted else 200)


@blueprint.delete("/profiles/<name>")
async def forget_profile(name: str) -> Response:
    """Forget a backend's profile in the scheduler and in the store."""
    observer = current_observer()
    if _backend_state(observer, name) is None:
        return _unknown_backend(name)
    observer.engine.send(AdminForgetProfile(backend=name))
    stored = observer.profiles is not None
    if observer.profiles is not None:
        await observer.profiles.forget(name)
    return json_response({"backend": name, "forgotten": True, "store": stored})


def new_lines(previous: Sequence[str], current: Sequence[str]) -> list[str]:
    """The lines of ``current`` that came after ``previous``, both being the
    tail of the same growing log (older lines fall off the front).

    The overlap is the longest tail of ``previous`` that starts ``current``.
    """
    if not previous:
        return list(current)
    last = previous[-1]
    for end in range(len(current) - 1, -1, -1):
        if current[end] != last:
            continue
        overlap = min(end + 1, len(previous))
        if list(current[end + 1 - overlap : end + 1]) == list(previous[-overlap:]):
            return list(current[end + 1 :])
    return list(current)


def _sse(data: str, event: str | None = None) -> bytes:
    lines = [f"event: {event}"] if event else []
    lines += [f"data: {part}" for part in data.split("\n")]
    return ("\n".join(lines) + "\n\n").encode()


@blueprint.get("/backends/<name>/log")
async def backend_log(name: str) -> Response:
    """The backend's log, as server-sent events (one ``data:`` line each)."""
    observer = current_observer()
    if _backend_state(observer, name) is None:
        return _unknown_backend(name)
    engine = observer.engine

    async def tail() -> AsyncIterator[bytes]:
        seen: list[str] = []
        yield b": yard log tail\n\n"
        while not observer.stopping():
            current = engine.backend_log(name)
            for line in new_lines(seen, current):
                yield _sse(line)
            seen = current
            await trio.sleep(LOG_POLL_S)

    response = Response(tail(), content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-store"
    response.timeout = None
    return response

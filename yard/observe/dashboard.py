"""``/dashboard``: the live page.

The page is rendered on the server from Jinja templates, one template per
section (memory, backends, queue, decisions, failures). The browser's small
script (``static/dashboard.js``, shipped with the package) opens
``/dashboard/events``, a server-sent event stream that sends a section again,
rendered by the same template, whenever it changed: right after each decision
of the engine, and at least every second (memory and ages move on their own).

With an admin key configured, the page asks for it once (a login form that
sets an HttpOnly cookie); the buttons then call the admin API with that cookie.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

import trio
from jinja2 import Environment
from quart import Blueprint, Response, current_app, render_template, request

from yard.observe import auth
from yard.observe.report import Json
from yard.observe.state import current_observer

SECTIONS = ("summary", "memory", "backends", "queue", "decisions", "failures")
"""The parts of the page, in order; each is ``yard_observe/section_NAME.html``."""

REFRESH_S = 1.0
"""Longest time between two checks for changes."""

COALESCE_S = 0.05
"""After a decision, wait this long for the ones that come with it."""

MIN_INTERVAL_S = 0.25
"""Shortest time between two renders for one client, however busy the
engine is (a render of a long queue costs milliseconds)."""

blueprint = Blueprint(
    "yard_dashboard",
    __name__,
    template_folder="templates",
    static_folder="static",
    static_url_path="/dashboard/static",
)


@blueprint.app_template_filter("yard_bytes")
def format_bytes(value: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"-"``."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


@blueprint.app_template_filter("yard_duration")
def format_duration(seconds: float | None) -> str:
    """``75`` -> ``"1m15s"``; None -> ``"-"``."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@blueprint.app_template_filter("yard_percent")
def format_percent(part: float | None, whole: float) -> str:
    """Share of ``whole`` as a CSS width (``"12.50%"``), within 0 and 100."""
    if not part or whole <= 0 or math.isnan(part):
        return "0%"
    return f"{max(0.0, min(100.0, 100.0 * part / whole)):.2f}%"


async def render_section(env: Environment, name: str, status: Json) -> str:
    """One section of the page, rendered from the status document. Sections
    need no request context, so the event stream renders them outside one."""
    return await env.get_template(f"yard_observe/section_{name}.html").render_async(status=status)


def _see_other(path: str) -> Response:
    # 303: after a form POST the browser GETs the page.
    return Response("", 303, {"Location": path})


def _needs_login() -> Response | None:
    """None if the request may see the dashboard; otherwise the answer."""
    refusal = current_observer().refusal()
    if refusal is None:
        return None
    return Response(refusal.message, refusal.status, content_type="text/plain; charset=utf-8")


@blueprint.get("/dashboard")
async def dashboard() -> Response | str | tuple[str, int]:
    """The page, complete as of now; the script keeps it current."""
    observer = current_observer()
    refusal = observer.refusal()
    if refusal is not None:
        if observer.admin_key is None:
            return Response(refusal.message, refusal.status, content_type="text/plain")
        error = "wrong admin key" if request.cookies.get(auth.COOKIE) else None
        return await render_template("yard_observe/login.html", error=error), 401
    status = observer.status()
    sections = {
        name: await render_section(current_app.jinja_env, name, status) for name in SECTIONS
    }
    return await render_template(
        "yard_observe/dashboard.html",
        status=status,
        sections=sections,
        has_key=observer.admin_key is not None,
    )


@blueprint.post("/dashboard/login")
async def login() -> Response | tuple[str, int]:
    """Check the admin key from the login form and set the cookie."""
    observer = current_observer()
    form = await request.form
    key = form.get("key", "")
    if observer.admin_key is None:
        return _see_other("/dashboard")
    if not auth.key_matches(key, observer.admin_key):
        return await render_template("yard_observe/login.html", error="wrong admin key"), 401
    response = _see_other("/dashboard")
    response.set_cookie(
        auth.COOKIE,
        auth.cookie_token(observer.admin_key),
        httponly=True,
        samesite="Strict",
        secure=request.scheme == "https",
        path="/",
    )
    return response


@blueprint.post("/dashboard/logout")
async def logout() -> Response:
    """Forget the login cookie."""
    response = _see_other("/dashboard")
    response.delete_cookie(auth.COOKIE, path="/")
    return response


def sse_event(event: str, payload: object) -> bytes:
    """One server-sent event whose data is ``payload`` as one line of JSON."""
    return f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode()


@blueprint.get("/dashboard/events")
async def events() -> Response:
    """Server-sent events: ``section`` events (``{"id", "html"}``) whenever a
    section of the page changed."""
    refused = _needs_login()
    if refused is not None:
        return refused
    observer = current_observer()
    env = current_app.jinja_env

    # A plain generator, not stream_with_context: Quart closes the body's
    # iterator when the client leaves, and a wrapped inner generator would be
    # left for the garbage collector.
    async def stream() -> AsyncIterator[bytes]:
        sent: dict[str, str] = {}
        feed = observer.engine.subscribe()
        try:
            yield b"retry: 2000\n\n"
            while not observer.stopping():
                rendered_at = trio.current_time()
                status = observer.status()
                for name in SECTIONS:
                    html = await render_section(env, name, status)
                    if sent.get(name) != html:
                        sent[name] = html
                        yield sse_event("section", {"id": name, "html": html})
                with trio.move_on_after(REFRESH_S):
                    try:
                        await feed.receive()
                    except (trio.EndOfChannel, trio.ClosedResourceError):
                        # The engine dropped us for being slow: follow again.
                        feed.close()
                        feed = observer.engine.subscribe()
                        continue
                    await trio.sleep_until(
                        max(trio.current_time() + COALESCE_S, rendered_at + MIN_INTERVAL_S)
                    )
                    while True:
                        try:
                            feed.receive_nowait()
                        except trio.WouldBlock:
                            break
                        except (trio.EndOfChannel, trio.ClosedResourceError):
                            feed.close()
                            feed = observer.engine.subscribe()
                            break
        finally:
            feed.close()

    response = Response(stream(), content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None
    return response

"""``/dashboard``: the live page.

The page is rendered on the server from Jinja templates, one template per
section (memory, backends, queue, decisions, failures). The browser's small
script (``static/dashboard.js``, shipped with the package) opens
``/dashboard/events``, a server-sent event stream that sends a section again,
rendered by the same template, whenever it changed: right after each decision
of the engine, and at least every second (memory and ages move on their own).

With an admin key configured, the page asks for it once (a login form that
opens a server-side session, see :mod:`yard.observe.auth`, and sets its
HttpOnly cookie); the buttons then call the admin API with that cookie.
The login form's body is read with a small limit of its own
(``server.dashboard_login_max_bytes``): on ``Content-Length``, and while
it streams in, before anything is parsed.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from urllib.parse import parse_qs

import trio
from jinja2 import Environment
from markupsafe import Markup
from quart import Blueprint, Response, current_app, render_template, request

from yard.api.keys import key_matches
from yard.h1.errors import error_body
from yard.observe import auth
from yard.observe.report import Json
from yard.observe.state import current_observer

SECTIONS = (
    "summary",
    "nodes",
    "timeline",
    "memory",
    "backends",
    "queue",
    "decisions",
    "failures",
)
"""The parts of the page, in order; each is ``yard_observe/section_NAME.html``
(``nodes`` is empty for a yard on its own)."""

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


async def render_section(env: Environment, name: str, status: Json, **context: object) -> str:
    """One section of the page, rendered from the status document (and
    ``context``: ``timeline_svg`` for the timeline). Sections need no request
    context, so the event stream renders them outside one."""
    template = env.get_template(f"yard_observe/section_{name}.html")
    return await template.render_async(status=status, **context)


def _see_other(path: str) -> Response:
    # 303: after a form POST the browser GETs the page.
    return Response("", 303, {"Location": path})


def _retry_after(wait_s: float | None) -> dict[str, str]:
    return {} if not wait_s else {"Retry-After": str(max(1, math.ceil(wait_s)))}


def _needs_login() -> Response | None:
    """None if the request may see the dashboard; otherwise the answer."""
    refusal = current_observer().refusal()
    if refusal is None:
        return None
    return Response(
        refusal.message,
        refusal.status,
        _retry_after(refusal.retry_after_s),
        content_type="text/plain; charset=utf-8",
    )


async def _login_page(error: str | None, status: int, wait_s: float | None = None) -> Response:
    html = await render_template("yard_observe/login.html", error=error)
    return Response(html, status, _retry_after(wait_s), content_type="text/html; charset=utf-8")


def _json_error(status: int, code: str, message: str) -> Response:
    return Response(error_body(status, code, message), status, content_type="application/json")


def _body_too_large(limit: int) -> Response:
    return _json_error(
        413,
        "body_too_large",
        f"the login form is larger than yard accepts ({limit} bytes, "
        "server.dashboard_login_max_bytes); send only the key field",
    )


async def _small_body(limit: int) -> bytes | None:
    """The request body, or None as soon as it is known to pass ``limit``
    bytes (by its Content-Length, or while it streams in)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    body = bytearray()
    async for chunk in request.body:
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


@blueprint.get("/dashboard")
async def dashboard() -> Response | str | tuple[str, int]:
    """The page, complete as of now; the script keeps it current."""
    observer = current_observer()
    refusal = observer.refusal()
    if refusal is not None:
        if observer.admin_key is None:
            return Response(refusal.message, refusal.status, content_type="text/plain")
        if refusal.status == 429:
            return await _login_page(refusal.message, 429, refusal.retry_after_s)
        error = None
        if request.cookies.get(auth.COOKIE):
            error = "your session has expired or was logged out; enter the admin key again"
        return await _login_page(error, 401)
    status = observer.status()
    svg = Markup(observer.timeline_svg())
    sections = {
        name: await render_section(current_app.jinja_env, name, status, timeline_svg=svg)
        for name in SECTIONS
    }
    return await render_template(
        "yard_observe/dashboard.html",
        status=status,
        sections=sections,
        has_key=observer.admin_key is not None,
    )


@blueprint.post("/dashboard/login")
async def login() -> Response:
    """Check the admin key from the login form, open a session, set its cookie.

    Answers 413 for a body over ``server.dashboard_login_max_bytes``, 415 for
    anything but a urlencoded form, 401 for a wrong key (with ``Retry-After``
    once the client must wait) and 429 while it must wait.
    """
    observer = current_observer()
    body = await _small_body(observer.login_max_bytes)
    if body is None:
        return _body_too_large(observer.login_max_bytes)
    if observer.admin_key is None:
        return _see_other("/dashboard")
    if request.mimetype != "application/x-www-form-urlencoded":
        return _json_error(
            415,
            "unsupported_media_type",
            "send the login form as application/x-www-form-urlencoded (key=...)",
        )
    now = observer.clock()
    client = request.remote_addr
    wait = observer.throttle.wait_s(client, now)
    if wait > 0:
        return await _login_page(auth.too_many_failures(wait).message, 429, wait)
    fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=16)
    key = fields.get("key", [""])[0]
    if not key_matches(key, observer.admin_key):
        wait = observer.throttle.failed(client, now)
        return await _login_page("wrong admin key", 401, wait)
    observer.throttle.succeeded(client)
    response = _see_other("/dashboard")
    response.set_cookie(
        auth.COOKIE,
        observer.sessions.open(now),
        max_age=max(1, int(observer.session_ttl_s)),
        httponly=True,
        samesite="Strict",
        # Behind a TLS proxy yard sees http, but the browser's Origin says
        # the page is https: the cookie then never travels in clear text.
        secure=request.scheme == "https"
        or request.headers.get("Origin", "").startswith("https://"),
        path="/",
    )
    return response


@blueprint.post("/dashboard/logout")
async def logout() -> Response:
    """End the session on the server and forget its cookie."""
    current_observer().sessions.close(request.cookies.get(auth.COOKIE))
    response = _see_other("/dashboard")
    response.delete_cookie(auth.COOKIE, path="/", httponly=True, samesite="Strict")
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
                svg = Markup(observer.timeline_svg())
                for name in SECTIONS:
                    html = await render_section(env, name, status, timeline_svg=svg)
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

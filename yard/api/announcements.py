"""The announcements API: ``/v1/announcements`` (mounted by :func:`register`
with the announcement service it serves).

- ``POST /v1/announcements``: ``{"model", "not_before" (RFC 3339) or
  "start_after" (s), "start_by" (RFC 3339) or "window_s" (s), "count",
  "priority"}``: yard loads the model so that it is ready when the window opens
  and keeps it for the window. 201 with the announcement.
- ``GET /v1/announcements``: the caller's announcements, newest first.
- ``GET /v1/announcements/ID``: one (status ``open``, ``used``, ``expired``,
  ``withdrawn``; ``used`` counts the requests that came).
- ``DELETE /v1/announcements/ID``: withdraw it.

An announcement belongs to the app whose key made it; to every other app it
does not exist (404). The admin key sees every app's.
"""

from __future__ import annotations

import json

from quart import Blueprint, Quart, Response, current_app, request

from yard.announce.service import AnnouncementNotFound, Announcements
from yard.api.body import json_object
from yard.api.errors import answer, quoted
from yard.api.keys import KeyCheck
from yard.api.served import Served
from yard.config import AppConfig
from yard.errors import Rejected

blueprint = Blueprint("announcements", __name__)
"""Mounted by :func:`register` with ``url_prefix="/v1/announcements"``."""


_KEY = "yard.announcements"


def register(app: Quart, service: Announcements | None, keys: KeyCheck) -> None:
    """Mount the announcements API on ``app`` at ``/v1/announcements``, serving
    ``service`` (None: every call answers 501)."""
    app.extensions[_KEY] = Served(service, keys)
    app.register_blueprint(blueprint, url_prefix="/v1/announcements")


def _caller() -> tuple[Announcements, AppConfig | None]:
    """The service and the caller's app (None: the admin, who sees all)."""
    served: Served[Announcements] = current_app.extensions[_KEY]
    # The key first: a wrong one counts as a guess even where the service is off.
    app = served.keys.caller(request.headers.get("authorization"), request.remote_addr)
    service = served.service
    if service is None:
        raise Rejected(
            501,
            "announcements_unavailable",
            "this yard runs without the announcement service (it needs the job store)",
        )
    return service, app


def _json(payload: object, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, content_type="application/json")


# A BadAnnouncement is a Rejected: answered as every other refusal, its ``param`` included.
blueprint.register_error_handler(Rejected, answer)


@blueprint.errorhandler(AnnouncementNotFound)
async def _not_found(error: AnnouncementNotFound) -> Response:
    return await answer(
        Rejected(
            404,
            "announcement_not_found",
            f"no announcement {quoted(error.args[0])} for this API key",
        )
    )


@blueprint.post("")
async def create() -> Response:
    service, app = _caller()
    if app is None:
        raise Rejected(
            400,
            "invalid_request",
            "announcements are made by an app: use the app's API key, not the admin key",
        )
    body = json_object(
        await request.get_data(as_text=False),
        expected="model, not_before or start_after, start_by or window_s, count, priority",
    )
    record = await service.create(app, body)
    return _json(service.describe(record), 201)


@blueprint.get("")
async def listed() -> Response:
    service, app = _caller()
    records = await service.listed(app=None if app is None else app.name)
    data = [service.describe(r) for r in records]
    return _json({"object": "list", "data": data})


@blueprint.get("/<announcement_id>")
async def get(announcement_id: str) -> Response:
    service, app = _caller()
    record = await service.get(announcement_id, app=None if app is None else app.name)
    return _json(service.describe(record))


@blueprint.delete("/<announcement_id>")
async def withdraw(announcement_id: str) -> Response:
    service, app = _caller()
    record = await service.withdraw(announcement_id, app=None if app is None else app.name)
    return _json(service.describe(record))

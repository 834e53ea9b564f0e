"""Reading and routing one data-plane request: from the ASGI scope and body
to a :class:`~yard.h1.upstream.ProxyRequest` for one backend.

These are the gateway's first two steps (:mod:`yard.http.gateway`), apart
from the exchange that follows them: headers in one pass, the API key to an
app, the scheduling headers (with :mod:`yard.api.intake`), the body, then
the backend: the one named in ``/backends/NAME/...``, or the one that serves
the ``model`` the body names (:mod:`yard.http.model_scan`), or another node
of the cluster (:class:`Forward`).

Rules it keeps:

- Request headers yard consumes (``X-Yard-*``, ``Content-Length``,
  ``Prefer``, hop-by-hop ones, the API key when it is yard's) never reach the
  backend; the backend sees ``X-Yard-Request-Id`` instead.
- A body over ``server.max_body_bytes`` is refused (413), before it is read
  when its ``Content-Length`` says so.
- The model of a large body is found on the loop, in turns of
  :data:`_TURN_S`, not in a worker thread (see :mod:`yard.http.model_scan`).
- A backend or model the app may not reach answers as one that does not
  exist, so that the app cannot tell them apart. At ``/backends/NAME/...``
  of a backend that also serves models outside the app's scope, a request
  with a body (or a method other than a read) must name one of the app's
  models, as on ``/v1``.
- The backend gets the path as it came over the wire (still
  percent-encoded), never the decoded one.
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import trio

from yard.api.intake import (
    authenticate,
    check_window,
    clamp_priority,
    flag,
    parse_not_before,
    parse_start_by,
    too_large,
    without_connection_options,
)
from yard.api.routes import mistyped_path, unknown_model
from yard.config import Config, local_app
from yard.engine import Engine
from yard.errors import Rejected
from yard.h1.asgi import Receive, Scope
from yard.h1.upstream import HOP_BY_HOP, Headers, ProxyRequest
from yard.http.model_scan import INLINE_LIMIT, Steps, model_of, model_steps
from yard.http.ports import Router

# Request headers yard consumes and never passes on.
_DROPPED = HOP_BY_HOP | {b"host", b"content-length", b"prefer"}
_READS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that, without a body, run no model (``/backends/NAME/props``)."""
_TURN_S = 0.001
"""How long a scan of a large body runs on the loop before other tasks get
a turn (:func:`_in_turns`)."""
T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected while its body was being read."""


class Forward(Exception):
    """Another node of the cluster serves this request (``target``: where, as
    the :class:`~yard.http.ports.Router` said)."""

    def __init__(self, target: object, body: bytes, priority: float, model: str) -> None:
        super().__init__(target)
        self.target, self.body, self.priority, self.model = target, body, priority, model


class RequestReader:
    """Reads the data-plane requests of one yard; the gateway holds one.

    config: the configuration (apps, backends, the body limit). engine: its
    clock places deadlines and time windows. router: the other nodes of the
    cluster, or None for a yard on its own.
    """

    def __init__(self, config: Config, engine: Engine, router: Router[Any] | None) -> None:
        self.engine = engine
        # A cluster node forwards requests another node should serve.
        self._router = router
        self.use_config(config)

    def use_config(self, config: Config) -> None:
        """Read requests with ``config`` from the next one on (``yard reload``)."""
        self.config = config
        self._max_body = config.server.max_body_bytes
        # Without app keys every request is the local app's: built once, not
        # per request (a dataclass per request was 0.6% of yard's CPU).
        self._local_app = local_app(config) if not config.apps else None

    async def read(
        self, scope: Scope, receive: Receive, request_id: str
    ) -> tuple[ProxyRequest, bool, bool, float | None]:
        """Read and check one request: (request, respond-async?, rerun-safe?,
        original arrival on the engine clock for a trusted forwarded one).

        Raises :class:`~yard.h1.errors.Rejected` for a request yard refuses
        (the caller answers it), :class:`ClientGone` when the client left
        while its body was read, and :class:`Forward` when another node of
        the cluster serves it (with the body, already read).
        """
        config = self.config
        forwarded: Headers = []
        authorization = content_type = content_length = None
        priority = start_by = start_within = allow_late = prefer = connection = None
        not_before = start_after = None
        forwarded_by = arrived_header = signature = None
        away_backend: str | None = None
        for name, value in scope["headers"]:
            if name.startswith(b"x-yard-"):
                if name == b"x-yard-forwarded-by":
                    forwarded_by = value
                elif name == b"x-yard-arrived-at":
                    arrived_header = value
                elif name == b"x-yard-cluster-signature":
                    signature = value
                elif name == b"x-yard-priority":
                    priority = value
                elif name == b"x-yard-start-by":
                    start_by = value
                elif name == b"x-yard-start-within":
                    start_within = value
                elif name == b"x-yard-allow-late":
                    allow_late = value
                elif name == b"x-yard-not-before":
                    not_before = value
                elif name == b"x-yard-start-after":
                    start_after = value
                continue
            if name == b"authorization":
                authorization = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                content_length = value
                continue
            elif name == b"prefer":
                prefer = value
            elif name == b"connection":
                connection = value
            if name not in _DROPPED:
                forwarded.append((name, value))

        first: float | None = None  # the arrival on the node that forwarded it
        if self._router is not None and forwarded_by is not None:
            vouched, first = self._router.vouch(
                forwarded_by=forwarded_by,
                arrived_at=arrived_header,
                signature=signature,
                now_wall=time.time(),
            )
            if not vouched:
                forwarded_by = None  # a client's own (yard.cluster.forward's rule)
        if self._local_app is not None:
            app, consumed = self._local_app, False
        else:
            app, consumed = authenticate(config, authorization)
        if consumed:
            forwarded = [h for h in forwarded if h[0] != b"authorization"]
        if connection is not None:
            forwarded = without_connection_options(forwarded, connection)
        # The backend sees yard's id, so its logs can be matched with yard's.
        forwarded.append((b"x-yard-request-id", request_id.encode()))
        if (
            content_length is not None
            and content_length.isdigit()
            and int(content_length) > self._max_body
        ):
            raise too_large(self._max_body)
        body = await self._read_body(receive)

        path: str = scope["path"]
        # The backend gets the path as it came over the wire (still
        # percent-encoded), never the decoded one: a decoded %0d%0a or space
        # would break the request line.
        raw_path = scope.get("raw_path") or path.encode()
        method: str = scope["method"]
        model: str | None = None
        if path.startswith("/backends/"):
            name = path[len("/backends/") :].partition("/")[0]
            rest = raw_path[len(b"/backends/") :].partition(b"/")[2]
            backend_config = config.backends.get(name)
            # A backend the app may not reach does not exist for it.
            if backend_config is None or not app.may_reach(backend_config):
                reachable = (b for b in config.backends.values() if app.may_reach(b))
                known = ", ".join(sorted(b.name for b in reachable)) or "none"
                raise Rejected(
                    404, "backend_not_found", f"no backend named {name!r} (configured: {known})"
                )
            upstream_path = "/" + rest.decode("latin-1")
            if not app.may_use_all(backend_config) and (body or method not in _READS):
                # The backend also serves models outside the app's scope: a
                # request that does work must name one of the app's, or the
                # backend would pick (or be told) a model the app may not use.
                # A bodiless read (GET /props, /health) names none and runs none.
                model = await self._scoped_model(method, content_type, body)
                if not app.may_use(model):
                    raise Rejected(
                        404,
                        "model_not_found",
                        f"the model {model!r} does not exist in this yard; "
                        "GET /v1/models lists them",
                    )
        else:
            mistyped = mistyped_path(path)
            if mistyped is not None:
                raise mistyped
            if len(body) <= INLINE_LIMIT:
                model = model_of(method, content_type, body)
            else:
                # On the loop, in turns: see yard.http.model_scan for why not
                # in a worker thread.
                model = await _in_turns(model_steps(method, content_type, body))
            backend_config = config.backend_for_model(model)
            if self._router is not None and forwarded_by is None and app.may_use(model):
                wants_job = prefer is not None and b"respond-async" in prefer.lower()
                target = self._router.route(
                    model, served_here=backend_config is not None, is_async=wants_job
                )
                if target is not None:
                    raise Forward(target, body, clamp_priority(config, app, priority), model)
                if backend_config is None and wants_job:
                    # Served only by nodes that are away: into the shared queue.
                    away_backend = self._router.queue_for(model)
            # Outside the app's models: the same answer as a model that does
            # not exist, so that the app cannot tell them apart.
            if (backend_config is None and away_backend is None) or not app.may_use(model):
                raise unknown_model(config, app, model)
            upstream_path = raw_path.decode("latin-1")
        backend = backend_config.name if backend_config is not None else away_backend
        assert backend is not None

        now = self.engine.now()
        deadline = parse_start_by(now, start_by, start_within)
        opens, window_label = parse_not_before(now, not_before, start_after)
        check_window(opens, deadline)
        request = ProxyRequest(
            method=method,
            path=upstream_path,
            query=scope.get("query_string", b""),
            headers=forwarded,
            body=body,
            backend=backend,
            app=app.name,
            priority=clamp_priority(config, app, priority),
            start_by=deadline,
            allow_late=flag(allow_late, "X-Yard-Allow-Late"),
            request_id=request_id,
            model=model,
            not_before=opens,
            window_label=window_label,
        )
        is_async = rerun_safe = False
        if prefer is not None:
            tokens = {
                t.strip().split(b"=")[0].lower() for t in prefer.replace(b";", b",").split(b",")
            }
            is_async = b"respond-async" in tokens
            rerun_safe = b"rerun-safe" in tokens
        arrived_at = None
        if first is not None:
            # first is not after the wall clock when it was read, so not after now.
            arrived_at = now - (time.time() - first)
        return request, is_async, rerun_safe, arrived_at

    async def _scoped_model(self, method: str, content_type: bytes | None, body: bytes) -> str:
        """The model a ``/backends/NAME/...`` request of a scoped app names.

        Raises :class:`Rejected` 400 ``model_required`` when it names none:
        without one the backend would choose, perhaps a model the app may
        not use.
        """
        try:
            if len(body) <= INLINE_LIMIT:
                return model_of(method, content_type, body)
            return await _in_turns(model_steps(method, content_type, body))
        except Rejected as error:
            if error.code != "model_required":
                raise
            raise Rejected(
                400,
                "model_required",
                "this backend also serves models your app may not use: name one of "
                "yours in the body's 'model' field",
            ) from None

    async def _read_body(self, receive: Receive) -> bytes:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            if len(body) > self._max_body:
                raise too_large(self._max_body)
            return body
        parts = [body]
        size = len(body)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                raise too_large(self._max_body)
            parts.append(chunk)
            if not message.get("more_body", False):
                if size <= INLINE_LIMIT:
                    return b"".join(parts)
                # Joining tens of MiB takes a good part of a second on a busy
                # machine; bytes.join lets go of the GIL for big joins, so in a
                # worker thread the loop keeps serving meanwhile.
                return await trio.to_thread.run_sync(b"".join, parts)


async def _in_turns(steps: Steps[T]) -> T:
    """Run ``steps`` (a scan, see :data:`yard.http.model_scan.Steps`) on the
    loop, letting the other tasks run every :data:`_TURN_S` seconds; its
    value (or what it raised)."""
    turn_ends = time.perf_counter() + _TURN_S
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if time.perf_counter() >= turn_ends:
            await trio.lowlevel.checkpoint()
            turn_ends = time.perf_counter() + _TURN_S

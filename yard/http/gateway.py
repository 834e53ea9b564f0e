"""The data plane: ``/v1/*`` and ``/backends/NAME/PATH``, as a lean ASGI app.

Every model request goes through here, so it stays close to the wire: raw
ASGI (no framework request objects), headers read in one pass, the body kept
as the bytes that arrived, the response streamed back chunk by chunk as the
backend sends it. Everything else (``/healthz``, jobs, dashboard, admin,
metrics) goes on to the Quart control plane behind it.

One request, in order:

1. read: API key -> app, scheduling headers, body (413 above the limit);
2. route: ``model`` (JSON body or multipart form field) -> backend, or the
   backend named in ``/backends/NAME/...``, or another node of the cluster
   (steps 1 and 2: :class:`yard.http.reader.RequestReader`);
3. ``Prefer: respond-async`` -> hand it to the job service (202), else
4. ``engine.submit`` -> wait for dispatch -> :func:`yard.h1.upstream.forward`
   -> stream back -> ``admission.report``;
5. the metrics hook it was handed (``yard.observe.observe_request`` in a
   running yard) hears the outcome, queue wait and latency.

Rules it keeps:

- Bodies and backend answers pass unchanged; a backend's 4xx/5xx is its
  answer and is never retried.
- The upstream connection breaking before any byte went to the client is
  reported as ``upstream_lost``: the core decides (requeue once after an OOM
  yard caused, or fail with ``backend_failed``). Once bytes went out, the
  response is cut and the outcome is ``error``.
- A client that goes away cancels its upstream call at once and frees its
  slot (or its queue place).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from yard.admission import Assignment, ResponseCut, UpstreamLost, run_turn
from yard.api.intake import authenticate, new_request_id, without_connection_options
from yard.api.routes import unknown_model
from yard.config import Config
from yard.core.spec import instance_name
from yard.engine import Engine
from yard.errors import Rejected
from yard.h1.asgi import ASGIApp, Receive, Scope, Send
from yard.h1.errors import error_body, error_headers
from yard.h1.upstream import HOP_BY_HOP, Headers, ProxyRequest, UpstreamError, UpstreamPool
from yard.http.ports import JobService, RequestHook, Router
from yard.http.reader import ClientGone, Forward, RequestReader
from yard.observe.auth import COOKIE as SESSION_COOKIE

if TYPE_CHECKING:
    from yard.engine import Admission

# (x-accel-buffering: yard adds its own "no"; a backend's would be a second.)
_RESPONSE_DROPPED = HOP_BY_HOP | {b"x-accel-buffering"}
_ACCEL = (b"x-accel-buffering", b"no")
# /v1 paths the control plane answers (the jobs and Batch APIs), not a model.
_CONTROL_V1 = ("/v1/jobs", "/v1/files", "/v1/batches", "/v1/announcements")
_CONTROL_NAMES = frozenset({"jobs", "files", "batches", "announcements"})
_JSON_CT = b"application/json"
_SESSION = SESSION_COOKIE.encode().lower()


class Gateway:
    """The ASGI app yard serves: the data plane, in front of ``control``.

    config: the configuration. engine: the scheduler loop requests are
    submitted to. pool: the upstream connections every call to a backend goes
    through. started_at: wall-clock time yard started (``/v1/models``'
    ``created``). jobs: the job service ``Prefer: respond-async`` hands
    requests to (None: answered 501). observe: the metrics hook, told how each
    request ended (None: nobody listens). router: the other nodes of the
    cluster (None: a yard on its own). health: what ``GET /healthz`` answers on
    a cluster node (None: the control plane answers it).
    """

    def __init__(
        self,
        control: ASGIApp,
        *,
        config: Config,
        engine: Engine,
        pool: UpstreamPool,
        started_at: float = 0.0,
        jobs: JobService | None = None,
        observe: RequestHook | None = None,
        router: Router[Any] | None = None,
        health: Callable[[], dict[str, object]] | None = None,
    ) -> None:
        self.control = control
        self.config = config
        self.engine = engine
        self.pool = pool
        self.started_at = started_at
        self.jobs = jobs
        # Reads and routes each request (a bound method, looked up once).
        self._reader = RequestReader(config, engine, router)
        self._read = self._reader.read
        self._observe = observe
        # A cluster node forwards requests another node should serve.
        self._router = router
        self._health = health

    def use_config(self, config: Config) -> None:
        """Serve with ``config`` from the next request on (``yard reload``)."""
        self.config = config
        self._reader.use_config(config)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route one ASGI connection event.

        - ``/v1/models``: the configured models (answered here);
        - ``/v1/jobs...``, ``/v1/files...``, ``/v1/batches...``,
          ``/v1/announcements...``: the jobs, Batch and announcement APIs (Quart);
        - other ``/v1/*``: routed by the ``model`` the request names, to the
          backend that serves it;
        - ``/backends/NAME/PATH``: ``PATH`` (query kept) on backend ``NAME``,
          queued and scheduled like any other request. Every configured
          backend is reachable this way, ``api = "openai"`` ones included:
          that is how a client gets at a server's own routes beside the
          OpenAI ones (llama-server's ``/tokenize``, ``/props``, ``/slots``...);
        - everything else: the Quart control plane.
        """
        if scope["type"] == "http":
            path: str = scope["path"]
            if path == "/healthz" and self._health is not None:
                # A node says how it stands in its cluster (the database, the nodes).
                return await _send_json(send, 200, self._health())
            if path.startswith("/v1/"):
                if path.startswith(_CONTROL_V1) and path[4:].partition("/")[0] in _CONTROL_NAMES:
                    return await self.control(scope, receive, send)
                if (path == "/v1/models" or path.startswith("/v1/models/")) and scope["method"] in (
                    "GET",
                    "HEAD",
                ):
                    return await self._models(scope, send)
                return await self._proxy(scope, receive, send)
            if path.startswith("/backends/"):
                return await self._proxy(scope, receive, send)
        await self.control(scope, receive, send)

    # -- the proxy ------------------------------------------------------------

    async def _proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = new_request_id()
        try:
            request, is_async, rerun_safe, arrived_at = await self._read(scope, receive, request_id)
        except Rejected as exc:
            return await _send_rejected(send, exc, request_id, None)
        except ClientGone:
            return None
        except Forward as forward:
            return await self._forward(scope, send, forward, request_id)
        if is_async:
            return await self._submit_job(request, rerun_safe, send)
        try:
            admission = self.engine.submit(
                backend=request.backend,
                priority=request.priority,
                app=request.app,
                request_id=request_id,
                start_by=request.start_by,
                allow_late=request.allow_late,
                arrived_at=arrived_at,
                not_before=request.not_before,
                window_label=request.window_label,
            )
        except Rejected as exc:
            # Refused before it was queued (the app's max_queued).
            if self._observe is not None:
                self._observe(
                    model=request.model or "",
                    backend=request.backend,
                    outcome=exc.code,
                    queued_s=None,
                    latency_s=None,
                )
            return await _send_rejected(send, exc, request_id, None)
        finished = False
        disconnect = (scope.get("extensions") or {}).get("yard.disconnect")
        try:
            if disconnect is not None:
                # yard's server cancels the scope when the client hangs up.
                with trio.CancelScope() as watched:
                    disconnect.watch(watched)
                    try:
                        await self._exchange(request, admission, send)
                        finished = True
                    finally:
                        disconnect.unwatch()
            else:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
                    await self._exchange(request, admission, send)
                    finished = True
                    nursery.cancel_scope.cancel()
        finally:
            if not finished:
                # Client gone (or we are shutting down): free the slot or the
                # queue place now. A no-op if it was already reported.
                admission.cancel()

    async def _exchange(self, request: ProxyRequest, admission: Admission, send: Send) -> None:
        pool = self.pool
        method = request.method.encode()
        target = request.target
        # What the metrics hook hears once this request ends, however it ends
        # (a client that leaves cancels us: "cancelled").
        outcome = "cancelled"
        dispatched_at: float | None = None
        observed = False

        async def attempt(assignment: Assignment) -> None:
            nonlocal dispatched_at
            dispatched_at = trio.current_time()
            started = False
            try:
                async with pool.request(
                    assignment.base_url, method, target, request.headers, request.body
                ) as response:
                    headers = _response_headers(response.headers)
                    headers += (
                        (b"x-yard-request-id", request.request_id.encode()),
                        (b"x-yard-queue-ms", b"%.1f" % (admission.queued_s * 1000.0)),
                        _ACCEL,
                    )
                    started = True
                    # When the body is already here, the head waits for it
                    # and both go out in one write (see yard.h1.server).
                    await send(
                        {
                            "type": "http.response.start",
                            "status": response.status,
                            "headers": headers,
                            "yard.hold": response.buffered(),
                        }
                    )
                    async for chunk in response.chunks():
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as exc:
                # Nothing reached the client: the core decides whether the
                # backend's death was yard's doing (requeue) or not (fail).
                # Bytes went out: the response is cut (the connection closes
                # without the final chunk) and nothing can be done.
                raise (ResponseCut if started else UpstreamLost)(exc.detail) from None

        try:
            try:
                outcome = await run_turn(admission, attempt)
            except Rejected as exc:
                outcome = exc.code
                return await _send_rejected(send, exc, request.request_id, admission.queued_s)
            if outcome == "error":
                return None
            # The backend's connection is back in its pool and the request is
            # reported and counted before the last (for a stream, the
            # terminating) write, so that this bookkeeping is done by the time
            # the same client's next request arrives, not what it waits behind.
            observed = True
            self._count(request, admission, outcome, dispatched_at)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return None
        finally:
            if not observed:
                self._count(request, admission, outcome, dispatched_at)

    def _count(
        self,
        request: ProxyRequest,
        admission: Admission,
        outcome: str,
        dispatched_at: float | None,
    ) -> None:
        """Tell the metrics hook how the request ended."""
        if self._observe is not None:
            self._observe(
                model=request.model or "",
                backend=request.backend,
                outcome=outcome,
                # Only a dispatched request has a queue wait, and only a
                # proxied one (ok or error) a latency.
                queued_s=admission.queued_s if dispatched_at is not None else None,
                latency_s=(
                    trio.current_time() - dispatched_at
                    if dispatched_at is not None and outcome in ("ok", "error")
                    else None
                ),
            )

    async def _submit_job(self, request: ProxyRequest, rerun_safe: bool, send: Send) -> None:
        jobs = self.jobs
        if jobs is None:
            return await _send_error(
                send,
                501,
                "jobs_unavailable",
                "this yard runs without the job service, so 'Prefer: respond-async' "
                "cannot be honoured; send the request without it",
                request.request_id,
                None,
            )
        try:
            job = await jobs.submit(request, rerun_safe=rerun_safe)
        except Rejected as exc:
            return await _send_rejected(send, exc, request.request_id, None)
        body = json.dumps(job).encode()
        headers = [
            (b"content-type", _JSON_CT),
            (b"content-length", b"%d" % len(body)),
            (b"location", f"/v1/jobs/{job['id']}".encode()),
            (b"preference-applied", b"respond-async"),
            (b"x-yard-request-id", request.request_id.encode()),
        ]
        await send({"type": "http.response.start", "status": 202, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _forward(self, scope: Scope, send: Send, forward: Forward, request_id: str) -> None:
        """Serve the request through the node it belongs on (cluster mode)."""
        assert self._router is not None
        raw = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        outcome = await self._router.proxy(
            forward.target,
            method=scope["method"],
            raw_target=raw + b"?" + query if query else raw,
            headers=scope["headers"],
            body=forward.body,
            priority=forward.priority,
            arrived_at=time.time(),
            request_id=request_id,
            send=send,
        )
        if self._observe is not None:
            # Served (and counted in full) by the other node; here: forwarded.
            self._observe(
                model=forward.model,
                backend="",
                outcome="forwarded" if outcome == "ok" else outcome,
                queued_s=None,
                latency_s=None,
            )

    # -- GET /v1/models ---------------------------------------------------------

    async def _models(self, scope: Scope, send: Send) -> None:
        request_id = new_request_id()
        config = self.config
        try:
            authorization = next((v for n, v in scope["headers"] if n == b"authorization"), None)
            app, _ = authenticate(config, authorization)
        except Rejected as exc:
            return await _send_rejected(send, exc, request_id, None)
        states = {b.name: b for b in self.engine.snapshot(limit=0).backends}
        created = int(self.started_at)
        entries = []
        for model, backend in config.models():
            if not app.may_use(model):
                continue
            view = states.get(backend)
            entry: dict[str, object] = {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "yard",
                "backend": backend,
                "state": view.state if view is not None else "stopped",
                "context": view.context if view is not None else None,
                "parallel": view.parallel if view is not None else None,
            }
            count = config.backends[backend].instances
            if count > 1:
                # Listed once; ready when any of its instances is.
                names = [instance_name(backend, k) for k in range(1, count + 1)]
                entry["instances"] = names
                if any(n in states and states[n].state == "ready" for n in names):
                    entry["state"] = "ready"
            entries.append(entry)
        path: str = scope["path"]
        payload: object
        if path == "/v1/models":
            payload = {"object": "list", "data": entries}
        else:
            wanted = path[len("/v1/models/") :]
            payload = next((e for e in entries if e["id"] == wanted), None)
            if payload is None:
                refused = unknown_model(config, app, wanted)
                return await _send_rejected(send, refused, request_id, None)
        body = json.dumps(payload).encode()
        headers = [
            (b"content-type", _JSON_CT),
            (b"content-length", b"%d" % len(body)),
            (b"x-yard-request-id", request_id.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _response_headers(headers: Headers) -> Headers:
    """A backend's response headers as they go to the client: without
    hop-by-hop headers, and without a cookie that would stand in for yard's
    own dashboard session (a backend must not log a browser in, or out)."""
    kept = [h for h in headers if h[0] not in _RESPONSE_DROPPED]
    for name, value in headers:
        if name == b"connection":
            kept = without_connection_options(kept, value)
        elif name == b"set-cookie" and value.partition(b"=")[0].strip().lower() == _SESSION:
            kept = [h for h in kept if h[0] != b"set-cookie" or h[1] != value]
    return kept


async def _watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _send_json(send: Send, status: int, payload: object) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", _JSON_CT), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_rejected(
    send: Send, exc: Rejected, request_id: str, queued_s: float | None
) -> None:
    """Answer ``exc`` in the OpenAI error shape, its ``param`` and
    ``Retry-After`` included, as the control plane's answers are."""
    await _send_error(
        send,
        exc.status,
        exc.code,
        exc.message,
        request_id,
        queued_s,
        exc.retry_after_s,
        param=exc.param,
    )


async def _send_error(
    send: Send,
    status: int,
    code: str,
    message: str,
    request_id: str,
    queued_s: float | None,
    retry_after_s: float | None = None,
    *,
    param: str | None = None,
) -> None:
    body = error_body(status, code, message, param)
    headers = error_headers(body, retry_after_s)
    headers.append((b"x-yard-request-id", request_id.encode()))
    if queued_s is not None:
        headers.append((b"x-yard-queue-ms", b"%.1f" % (queued_s * 1000.0)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})

"""Forwarding synchronous requests to the node that should serve them.

Any node of a cluster accepts any request. The gateway asks
:meth:`Forwarder.route` once it knows the request's model and app; when
another node should serve it (this node does not serve the model, or another
node has it ready while this one would have to load it: the rules of
:func:`yard.cluster.policy.route`), the gateway hands the request to
:meth:`Forwarder.proxy`, which sends it there through yard's own upstream
client and streams the answer back chunk by chunk, unchanged.

Rules it keeps:

- **Never forwarded twice.** A forwarded request carries
  ``X-Yard-Forwarded-By: NODE``; a node that gets one serves it itself (or
  refuses it as any request), whatever its registry says. With ``[cluster]
  secret`` the header counts only with a valid ``X-Yard-Cluster-Signature``
  (:meth:`Forwarder.vouch`): a client's own header is ignored, and cannot
  turn forwarding off for its request. Without a secret nothing can be
  proven, and the header counts: set a secret on any cluster clients reach.
- **A model served only by nodes that are away** (no fresh heartbeat, or
  gone) is not unknown: a synchronous request for it is refused with 503
  ``model_away`` and ``Retry-After`` (:meth:`Forwarder.route`); a job for it
  goes into the shared queue for its backend (:meth:`Forwarder.queue_for`),
  and the node claims it when it is back.
- **One age everywhere.** The request carries its priority as the first node
  settled it (``X-Yard-Priority``, already clamped to the app's range; the
  serving node clamps again, with the same ``[apps]``) and its arrival on the
  first node (``X-Yard-Arrived-At``, wall-clock epoch seconds). The arrival is
  believed only when the request also carries ``X-Yard-Cluster-Signature``,
  an HMAC-SHA256 under the cluster's shared secret of the forwarding node's
  name and that arrival, compared with :func:`hmac.compare_digest` (once per
  request: :func:`vouch` answers both questions); and never as later than
  now. Without the secret (or with a wrong signature) the request ages from
  when it reached the serving node: a client cannot buy itself age by sending
  the header.
- The client's own headers go on as they came (``Authorization`` included:
  the serving node authenticates the app itself), less hop-by-hop ones and
  the cluster headers a client may have sent.
- A node that cannot be reached before any byte was sent is answered with 502
  ``node_unreachable``; a stream cut in the middle is cut for the client too.
  Nothing is ever retried.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from yard.cluster.policy import Peer, route
from yard.errors import Rejected
from yard.h1.errors import error_body, error_headers
from yard.h1.upstream import HOP_BY_HOP, Headers, UpstreamError, UpstreamPool

log = logging.getLogger("yard.cluster")

FORWARDED_BY = b"x-yard-forwarded-by"
ARRIVED_AT = b"x-yard-arrived-at"
SIGNATURE = b"x-yard-cluster-signature"
PRIORITY = b"x-yard-priority"
ROUTE = b"x-yard-node"

# Headers never passed on: hop-by-hop ones, those the upstream client writes
# itself, and the cluster's own (set anew by the forwarding node).
_DROPPED = HOP_BY_HOP | {b"host", b"content-length", FORWARDED_BY, ARRIVED_AT, SIGNATURE, PRIORITY}
_RESPONSE_DROPPED = HOP_BY_HOP

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


def sign(secret: str, node: str, arrived_at: str) -> str:
    """The signature a forwarded request carries: HMAC-SHA256 (hex) under
    ``secret`` of the forwarding node's name and the arrival exactly as sent."""
    message = f"{node}\n{arrived_at}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def vouch(
    *,
    secret: str | None,
    forwarded_by: bytes | None,
    arrived_at: bytes | None,
    signature: bytes | None,
    now_wall: float,
) -> tuple[bool, float | None]:
    """Whether a request's ``X-Yard-Forwarded-By`` counts, and the original
    arrival (epoch) it may be believed to carry, with one signature check.

    The header counts when present and, with a ``secret``, signed
    (``X-Yard-Cluster-Signature`` over the node's name and
    ``X-Yard-Arrived-At``); without a secret nothing can be proven and it
    counts as sent. The arrival is believed only when signed and a finite
    number, and never as later than ``now_wall`` (a node's clock ahead of
    ours must not make a request younger than new); None: it ages from now.
    """
    if forwarded_by is None:
        return False, None
    if secret is None:
        return True, None
    if arrived_at is None or signature is None:
        return False, None
    try:
        node, text, given = (
            forwarded_by.decode("ascii"),
            arrived_at.decode("ascii"),
            signature.decode("ascii"),
        )
    except UnicodeDecodeError:
        return False, None
    expected = sign(secret, node, text)
    if not hmac.compare_digest(expected.encode(), given.strip().lower().encode()):
        return False, None
    try:
        value = float(text)
    except ValueError:
        return True, None
    if not math.isfinite(value):
        return True, None
    return True, min(value, now_wall)


def forward_headers(
    headers: Sequence[tuple[bytes, bytes]],
    *,
    node: str,
    arrived_at: float,
    priority: float,
    secret: str | None,
) -> Headers:
    """The headers a request is forwarded with: the client's, less hop-by-hop
    and cluster headers, plus who forwards it, its priority and arrival (and
    the signature that makes the arrival count, when there is a secret)."""
    connection_options: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            connection_options |= {t.strip().lower() for t in value.split(b",")}
    kept = [
        (name, value)
        for name, value in headers
        if name not in _DROPPED and name not in connection_options
    ]
    text = repr(float(arrived_at))
    kept += [
        (FORWARDED_BY, node.encode()),
        (PRIORITY, repr(float(priority)).encode()),
        (ARRIVED_AT, text.encode()),
    ]
    if secret is not None:
        kept.append((SIGNATURE, sign(secret, node, text).encode()))
    return kept


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where a request goes: the node's name, its URL, and why."""

    node: str
    url: str
    reason: str


@dataclass(slots=True)
class _View:
    peers: tuple[Peer, ...] = ()
    urls: Mapping[str, str] = field(default_factory=dict)


class Forwarder:
    """This node's side of forwarding (see the module rules).

    node: this node's name. secret: the cluster's shared secret (None: arrival
    times are neither signed nor believed). pool: the upstream pool requests go
    through (the gateway's). The node (:mod:`yard.cluster.node`) keeps the view
    of the cluster current with :meth:`update`.
    """

    def __init__(
        self, *, node: str, secret: str | None, pool: UpstreamPool, retry_after_s: float = 5.0
    ) -> None:
        self.node = node
        self.secret = secret
        self.retry_after_s = retry_after_s
        self._pool = pool
        self._view = _View()
        self.forwarded = 0
        self.unreachable = 0

    def update(self, peers: Sequence[Peer], urls: Mapping[str, str]) -> None:
        """The cluster as it stands now: every node (this one included, with
        what it has ready now) and where each is reached."""
        self._view = _View(peers=tuple(peers), urls=dict(urls))

    @property
    def peers(self) -> tuple[Peer, ...]:
        return self._view.peers

    def route(self, model: str, *, served_here: bool, is_async: bool) -> Target | None:
        """Another node to send this request for ``model`` to, or None (serve
        it here, or refuse it here as any request for an unknown model).
        Raises :class:`~yard.errors.Rejected` 503 ``model_away`` for a
        synchronous request for a model only nodes that are away serve.

        served_here: this node serves the model. is_async: the request asks to
        become a job; a job for a model served here goes into the shared queue
        from here (the claim picks its node), so only a job for a model this
        node does not serve is forwarded.
        """
        if served_here and is_async:
            return None
        view = self._view
        choice = route(model, view.peers, self.node)
        if not choice.forward:
            away = None if served_here or is_async else self._away(model)
            if away is not None:
                names, _ = away
                raise Rejected(
                    503,
                    "model_away",
                    f"{model} is served only by node {names}, which is away now (no recent "
                    "heartbeat, or it left the cluster): try again shortly, or hand it in "
                    "as a job ('Prefer: respond-async'), which waits until the node is back",
                    retry_after_s=self.retry_after_s,
                )
            return None
        url = view.urls.get(choice.node)
        if url is None:
            return None
        return Target(node=choice.node, url=url, reason=choice.reason)

    def queue_for(self, model: str) -> str | None:
        """The backend whose shared queue takes a job for ``model`` that no
        node serves now because those that do are away; None if none does (or
        their backends cannot be told)."""
        away = self._away(model)
        return None if away is None else away[1]

    def _away(self, model: str) -> tuple[str, str | None] | None:
        """The nodes, away, that serve ``model`` (names), and its backend."""
        away = sorted(p.name for p in self._view.peers if not p.up and model in p.serves)
        if not away:
            return None
        backends = {
            p.backend_of[model]
            for p in self._view.peers
            if p.name in away and model in p.backend_of
        }
        return ", ".join(away), backends.pop() if len(backends) == 1 else None

    def vouch(
        self,
        *,
        forwarded_by: bytes | None,
        arrived_at: bytes | None,
        signature: bytes | None,
        now_wall: float,
    ) -> tuple[bool, float | None]:
        """Whether a request's ``X-Yard-Forwarded-By`` counts, and its original
        arrival where its signature under this cluster's secret holds
        (:func:`vouch`; see the module rules)."""
        return vouch(
            secret=self.secret,
            forwarded_by=forwarded_by,
            arrived_at=arrived_at,
            signature=signature,
            now_wall=now_wall,
        )

    async def proxy(
        self,
        target: Target,
        *,
        method: str,
        raw_target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        priority: float,
        arrived_at: float,
        request_id: str,
        send: Send,
    ) -> str:
        """Send the request to ``target`` and stream its answer to ``send``.

        Returns the outcome: ``ok`` (answered, whatever the status), ``error``
        (the answer was cut after it began) or ``node_unreachable`` (answered
        here with 502). The caller bounds nothing: the other node's own
        limits apply, and a client that leaves cancels this call.
        """
        sent = forward_headers(
            headers, node=self.node, arrived_at=arrived_at, priority=priority, secret=self.secret
        )
        self.forwarded += 1
        started = False
        try:
            async with self._pool.request(
                target.url, method.encode(), raw_target, sent, body
            ) as response:
                out = [h for h in response.headers if h[0] not in _RESPONSE_DROPPED]
                out.append((ROUTE, target.node.encode()))
                started = True
                await send(
                    {"type": "http.response.start", "status": response.status, "headers": out}
                )
                async for chunk in response.chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as exc:
            if started:
                log.warning("forwarded request %s to %s cut: %s", request_id, target.node, exc)
                return "error"
            self.unreachable += 1
            log.warning("node %s unreachable for %s: %s", target.node, request_id, exc.detail)
            message = (
                f"this request was for node {target.node} ({target.reason}), which cannot be "
                f"reached ({exc.detail}); try again shortly"
            )
            payload = error_body(502, "node_unreachable", message)
            head = error_headers(payload, 1.0)
            head.append((b"x-yard-request-id", request_id.encode()))
            await send({"type": "http.response.start", "status": 502, "headers": head})
            await send({"type": "http.response.body", "body": payload, "more_body": False})
            return "node_unreachable"
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "ok"

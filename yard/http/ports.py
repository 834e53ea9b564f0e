"""What the data plane is handed: the services it calls, as interfaces.

The gateway imports none of the packages that implement them (the job
service, the cluster, the metrics): the composition root (:mod:`yard.app`)
hands it the real ones, tests hand it fakes (``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Protocol, TypeVar

from yard.h1.upstream import ProxyRequest

T = TypeVar("T")


class RequestHook(Protocol):
    """What the gateway calls once per proxied request as it ends
    (``yard.observe.observe_request`` in a running yard).

    outcome: ``ok``, ``error`` (the response was cut), ``cancelled`` (the
        client left, or yard is stopping), ``forwarded`` (another node served
        it), or the code it was rejected with.
    queued_s: arrival to dispatch; None when it was never dispatched.
    latency_s: dispatch to the end of the response; None unless proxied.
    """

    def __call__(
        self,
        *,
        model: str,
        backend: str,
        outcome: str,
        queued_s: float | None,
        latency_s: float | None,
    ) -> None: ...


class JobService(Protocol):
    """The async-job side of yard, as the proxy sees it."""

    async def submit(self, request: ProxyRequest, *, rerun_safe: bool) -> dict[str, object]:
        """Record ``request`` as a job and return its JSON (it has an ``"id"``).

        ``rerun_safe``: the client said the request may run again after a
        restart interrupted it (``Prefer: respond-async, rerun-safe``).
        Raises :class:`yard.errors.Rejected` when the job cannot be accepted;
        the proxy answers with that error.
        """
        ...


class Router(Protocol[T]):
    """The other nodes of a cluster, as the data plane sees them
    (:class:`yard.cluster.forward.Forwarder` in a cluster node; none for a yard
    on its own). ``T``: where a request goes (the router's own record, handed
    back to :meth:`proxy` unchanged)."""

    def route(self, model: str, *, served_here: bool, is_async: bool) -> T | None:
        """Another node to send this request for ``model`` to, or None to
        serve it here (or refuse it here as any request). May raise
        :class:`yard.errors.Rejected` (the nodes that serve it are away)."""
        ...

    def queue_for(self, model: str) -> str | None:
        """The backend whose shared queue takes a job for ``model``, a model
        no node here serves now because the nodes that do are away; None:
        the model is unknown."""
        ...

    def vouch(
        self,
        *,
        forwarded_by: bytes | None,
        arrived_at: bytes | None,
        signature: bytes | None,
        now_wall: float,
    ) -> tuple[bool, float | None]:
        """Whether a request's ``X-Yard-Forwarded-By`` is another node's (and
        not a client's own: it then is served or refused here), and its
        original arrival (epoch seconds, not after ``now_wall``) if that can
        be believed (None: it ages from now). One signature check for both."""
        ...

    async def proxy(
        self,
        target: T,
        *,
        method: str,
        raw_target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        priority: float,
        arrived_at: float,
        request_id: str,
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> str:
        """Send the request to ``target`` and stream its answer to ``send``;
        the outcome (``ok``, ``error``, ``node_unreachable``)."""
        ...

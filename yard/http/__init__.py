"""The HTTP side of yard.

- ``server``: a lean HTTP/1.1 server on Trio that runs yard's ASGI app
  inline per connection; hypercorn cost about 300 µs of CPU per request by
  itself, more than the whole proxy budget.
- ``wire``: the server's HTTP/1.1 parsing and framing, sans-I/O (bytes in,
  events out), 4 to 7 times cheaper than h11 for yard's requests.
- ``sockio``: socket reads and writes that skip Trio's run loop when the
  kernel is ready (the hot path's largest cost after parsing).
- ``gateway``: the data plane: ``/v1/*`` and ``/backends/NAME/PATH`` as a raw
  ASGI app that reads, checks, schedules and streams requests.
- ``reader``: the gateway's first steps: one request read and routed to a
  backend (or to another node of the cluster).
- ``intake``: reading a request's headers: API key, priority, deadline.
- ``model_scan``: the ``model`` a request's body names, found at a cost the
  event loop can bear (large bodies are scanned in steps, never parsed whole).
(The upstream client, :func:`yard.upstream.forward` and its keep-alive pool,
lives outside this package: the job service uses it too.)
- ``app``: the whole ASGI app (data plane in front of the Quart control plane:
  ``/healthz``, jobs, dashboard, metrics, admin) and :func:`~yard.http.app.serve_app`.
- ``errors``: yard's own errors in the OpenAI shape.
- ``runtime``: :class:`~yard.http.runtime.Runtime`, what every part is handed.
"""

"""The HTTP side of yard.

- ``server``: a lean HTTP/1.1 server (Trio + h11) that runs yard's ASGI app
  inline per connection; hypercorn cost about 300 µs of CPU per request by
  itself, more than the whole proxy budget.
- ``gateway``: the data plane: ``/v1/*`` and ``/backends/NAME/PATH`` as a raw
  ASGI app that reads, checks, schedules and streams requests.
- ``proxy``: :class:`~yard.http.proxy.ProxyRequest`, :func:`~yard.http.proxy.forward`
  and the upstream keep-alive pool (its own small HTTP/1.1 client).
- ``app``: the whole ASGI app (data plane in front of the Quart control plane:
  ``/healthz``, jobs, dashboard, metrics, admin) and :func:`~yard.http.app.serve_app`.
- ``errors``: yard's own errors in the OpenAI shape.
- ``runtime``: :class:`~yard.http.runtime.Runtime`, what every part is handed.
"""

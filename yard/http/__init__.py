"""The HTTP side of yard.

- ``proxy``: :class:`~yard.http.proxy.ProxyRequest` and :func:`~yard.http.proxy.forward`,
  the upstream connection pool (the data plane's way out).
- ``gateway``: the data plane: ``/v1/*`` and ``/backends/NAME/PATH`` as a lean
  ASGI app that reads, checks, schedules and streams requests.
- ``app``: the whole ASGI app: the data plane in front of the Quart control
  plane (``/healthz``, jobs, dashboard, metrics, admin).
- ``runtime``: :class:`~yard.http.runtime.Runtime`, what every part is handed.
"""

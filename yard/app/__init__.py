"""The composition root: the one place that builds every part of a running
yard and hands each its services (``docs/architecture.md``).

- ``serve``: ``yard serve``: the nursery tree, the stop signals.
- ``web``: the whole ASGI app: the browser guard, the data plane
  (:mod:`yard.http`), then the Quart control plane with each API registered
  with the service it uses.
- ``openapi``: the OpenAPI 3.1 document of yard's own API (``/openapi.json``).
"""

"""The data plane: ``/v1/*`` and ``/backends/NAME/PATH``, read, checked,
scheduled and streamed.

- ``gateway``: the raw ASGI app that answers the data plane itself and hands
  everything else to the control plane.
- ``reader``: the gateway's first steps: one request read and routed to a
  backend (or to another node of the cluster, through the router it is given).
- ``model_scan``: the ``model`` a request's body names, found at a cost the
  event loop can bear (large bodies are scanned in steps, never parsed whole).
- ``guard``: the browser guard in front of everything (origins, hosts).

The HTTP/1.1 server and client it runs on are :mod:`yard.h1`; the header
parsing every API shares is :mod:`yard.api.intake`.
"""

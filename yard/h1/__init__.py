"""yard's HTTP/1.1 library: a server and a client, and nothing of yard's domain.

It imports nothing of yard but itself (see ``docs/architecture.md``), so that
it can be read, tested and measured as the protocol alone.

- ``wire``: HTTP/1.1 parsing and framing, sans-I/O (bytes in, events out),
  4 to 7 times cheaper than h11 for yard's requests; the server and the
  client both use it.
- ``sockio``: socket reads and writes that skip Trio's run loop when the
  kernel is ready (the hot path's largest cost after parsing).
- ``server``: a lean HTTP/1.1 server on Trio that runs an ASGI app inline per
  connection (hypercorn cost about 300 µs of CPU per request by itself, more
  than the whole proxy budget); ``connection`` serves one connection,
  ``exchange`` one request on it, ``lobby`` holds connections that have not
  sent a whole head yet, ``limits`` and ``screening`` are the connection
  limits and what the server answers when one is hit, ``lifespan`` runs the
  app's ASGI lifespan, ``asgi`` names the ASGI types.
- ``errors``: the JSON error shape (OpenAI's) every answer of yard's own uses.
- ``upstream``: the client: one request to a backend, its response streamed
  back, over a keep-alive pool.
"""

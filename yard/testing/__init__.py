"""Things for testing yard against real processes.

- ``python -m yard.testing.backend``: a small, fast OpenAI-speaking HTTP
  server that holds real memory and fails on demand (crash, out-of-memory,
  hang, garbage, slow start, failing health check). See
  :mod:`yard.testing.backend` for its switches, and
  ``yard.testing.backend.backend_command`` to build its argv.
- ``yard.testing.fake``: the in-process fake backend of the proxy, jobs and
  benchmark tests (h11 on Trio; ``python -m yard.testing.fake`` for a
  process of it).
- ``yard.testing.payloads``: what they send (PNG, WAV, embeddings, bytes).

(Nothing is imported here, so that ``python -m yard.testing.backend`` runs the
module exactly once.)
"""

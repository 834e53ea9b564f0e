"""Things for testing yard against real processes.

- ``yard.testing.fake``: the one fake HTTP backend of yard's tests and
  benchmarks (h11 on Trio): in-process (``serve_fake``) or as a process.
  Its special paths (``/status/N``, ``/cut-after``, ``/hang``, ...) and its
  failure switches (crash, out-of-memory, hang, garbage, slow start,
  failing health check) are listed there.
- ``python -m yard.testing.backend``: the fake as a model server process that
  holds real memory and fails on demand; ``yard.testing.backend.backend_command``
  builds its argv, and ``yard.testing.process.running_backend`` runs it.
- ``yard.testing.payloads``: what they send (PNG, WAV, embeddings,
  completions, bytes).

(Nothing is imported here, so that ``python -m yard.testing.backend`` runs the
module exactly once.)
"""

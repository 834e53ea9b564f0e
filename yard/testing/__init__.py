"""The fakes of yard's tests, one of each thing yard talks to (the table in
``docs/architecture.md``, "Fakes"), each failing the way the real one does.

- ``yard.testing.engine``: ``FakeEngine``, the engine's surface over the real
  admissions, for everything above the engine (jobs, the data plane,
  observability, a cluster node), and builders of the core's views.
- ``yard.testing.ports``: the ports' fakes (``FakeLauncher`` and its scripted
  processes, ``FakeMeter``, ``MemoryProfileStore``) and a ``ScriptedPolicy``
  in place of the core, for the engine and above.
- ``yard.testing.upstream``: ``FakeUpstream``, the upstream client as the job
  service calls it, with scripted answers.
- ``yard.testing.fake``: the one fake HTTP backend of yard's tests and
  benchmarks (h11 on Trio): in-process (``serve_fake``) or as a process.
  Its special paths (``/status/N``, ``/cut-after``, ``/hang``, ...) and its
  failure switches (crash, out-of-memory, hang, garbage, slow start,
  failing health check) are listed there.
- ``python -m yard.testing.backend``: the fake as a model server process that
  holds real memory and fails on demand; ``yard.testing.backend.backend_command``
  builds its argv, and ``yard.testing.process.running_backend`` runs it.
- ``yard.testing.gpu``: a GPU shared by real processes (``SharedGpu``) and
  the one fake ``pynvml`` (``FakeNvml``), with the driver's error codes, over
  such cards or over boards in memory (``FakeGpu``) for the meter's own tests.
- ``yard.testing.payloads``: what they send (PNG, WAV, embeddings,
  completions, bytes).

Harnesses that run the real thing, shared by the tests and the benchmarks:

- ``yard.testing.postgres``: a real PostgreSQL server (``start_postgres``).
- ``yard.testing.cluster``: real ``yard serve`` nodes sharing its database
  (``running_cluster``, ``Cluster``).
- ``yard.testing.client``: an httpx client for a server killed under it.

(Nothing is imported here, so that ``python -m yard.testing.backend`` runs the
module exactly once.)
"""

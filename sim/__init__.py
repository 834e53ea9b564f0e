"""The proving ground: the same engine and core as ``yard serve``, under virtual time,
with simulated devices, backends and workloads. ``python -m sim report`` compares yard
with baseline policies; ``python -m sim bench`` times it. docs/simulation.md explains it.

Layout:

- ``world``: the simulated machine (devices with a hard capacity, backend processes that
  load, serve, grow and crash; faults); it is the engine's launcher, meter and profile
  store.
- ``workload``: arrivals and scenarios as data; ``scenarios``: the named ones.
- ``baselines``: today's peers: llama-swap (FIFO grouping, matrix), Ollama, llama.cpp's
  router (count LRU, ``--fit``), LocalAI (LRU, memory reclaimer).
- ``runner``: one scenario under one policy with one seed, on ``MockClock``.
- ``metrics``: deadlines, waits, loads and their lower bounds, GPU time.
- ``__main__``: the report and the benchmark; ``bench_core``: the core's own benchmark.
"""

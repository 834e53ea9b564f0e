"""yard: a bouncer for the GPU.

One HTTP gateway in front of the local model servers of one machine. It
decides who goes first, what is loaded, and what happens to long work.

The rooms, from the inside out:

- ``yard.core``: the scheduler. Pure: events and the time go in, decisions
  come out. No I/O, no clock, no randomness of its own.
- ``yard.engine``: the Trio loop that feeds the core and carries out its
  decisions through the ports of ``yard.ports``.
- ``yard.supervisor``: real backend processes (start, health, logs, stop).
- ``yard.memory``: meters (NVML, host) and profiles.
- ``yard.store``: SQLite (jobs, profiles).
- ``yard.http``: the quart-trio app: proxy, jobs, admin, dashboard, metrics.
- ``yard.upstream``: the HTTP client that sends requests to backends.
- ``yard.config``: the TOML configuration; ``yard.cli``: the command line.
- ``sim`` (beside the package): the same engine and core under virtual time.
"""

__version__ = "0.1.0"

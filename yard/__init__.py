"""yard: a bouncer for the GPU.

One HTTP gateway in front of the local model servers of one machine. It
decides who goes first, what is loaded, and what happens to long work.

The rooms, from the inside out:

- ``yard.core``: the scheduler. Pure: events and the time go in, decisions
  come out. No I/O, no clock, no randomness of its own.
- ``yard.ports``: the edges (launcher, meter, profile store, logs), as
  interfaces with fakes beside them.
- ``yard.engine``: the Trio loop that feeds the core and carries out its
  decisions through the ports (``loop``, ``backends``, ``metering``).
- ``yard.admission``: one request's turn (its Admission, ``run_turn``);
  ``yard.errors``: ``Rejected``, the one refusal.
- ``yard.supervisor``: real backend processes, by role (``launcher``,
  ``process``, ``readiness``, ``groups``, ``pidfiles``).
- ``yard.memory``: meters (``nvml``, ``drm``, ``apple``, ``host``; ``gpus``:
  which GPU is which), profiles, first-load measurement, ``yard probe``.
- ``yard.h1``: the HTTP/1.1 library: the server (``server``, ``connection``,
  ``exchange``, ``wire``, ``sockio``, ``limits``) and the client that sends
  requests to backends (``upstream``).
- ``yard.api``: what every API shares (``intake``: keys, priorities,
  deadlines; ``errors``: a refusal answered).
- ``yard.http``: the data plane (``gateway``, ``reader``, ``model_scan``) and
  the browser ``guard``.
- ``yard.app``: the composition root: ``serve`` builds every part and hands
  each its services; ``web`` is the whole ASGI app; ``openapi``.
- ``yard.jobs``: durable async jobs; ``yard.batches``: the OpenAI Batch API
  on them; ``yard.announce``: work announced ahead; ``yard.db``: the database
  interface every store is written against, and SQLite.
- ``yard.observe``: dashboard, ``/metrics``, admin API; ``yard.status``: the
  same in a terminal.
- ``yard.config``: the TOML configuration, by section; ``yard.cli``: the
  command line (``yard.app.serve``; ``yard.keys``: ``yard key new``).
- ``yard.testing``: test backends (a real process, an in-process fake);
  ``yard.demo``: a tiny model and the demo servers.
- ``yard.compiled``: which core runs: the core compiled with mypyc
  (``python -m yard.build_core``) if it was built from these sources, else the
  plain-Python one; ``YARD_CORE=pure`` forces the latter.
- ``sim`` (beside the package): the same engine and core under virtual time.
"""

__version__ = "0.1.0"

from yard import compiled as _compiled

_compiled.use()  # the compiled core, if it is built from these sources (yard.compiled)

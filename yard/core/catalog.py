"""Backends that come and go while yard runs (``yard reload``, the models
folder): :class:`~yard.core.events.BackendsChanged`.

Rules this module keeps:

- **Added**: known at once, stopped, placed like any other backend when a
  request needs it. Planning starts afresh (``room_version``).
- **Removed**: gets no new request. What waits for it and cannot be served
  (it is not loaded) ends at once with 404 ``model_removed``; what runs
  finishes (it drains); then it is stopped and forgotten. A stopped or failed
  one is forgotten at once.
- **Replaced** (its spec changed): the queue stays; a loaded one drains and
  stops once idle (its running requests finish on the old process), then the
  new spec applies and the next request starts it anew. Its profile is
  forgotten: the new command may need other memory (the engine hands the
  core a stored profile of the new footprint, if there is one).
- A backend never stops for a change while it serves: only once it is idle.
"""

from __future__ import annotations

from yard.core.decisions import Decision
from yard.core.events import BackendsChanged
from yard.core.lifecycle import LOADED, BackendState, Move
from yard.core.queue import RequestQueue
from yard.core.records import Backend
from yard.core.spec import BackendSpec, SchedulerConfig
from yard.core.state import Core

__all__ = ["changed", "new_backend", "settle", "settle_touched"]

REMOVED = "removed from the configuration"
CHANGED = "its configuration changed"


def new_backend(spec: BackendSpec, config: SchedulerConfig) -> Backend:
    """The core's record of a backend it has never run."""
    return Backend(
        spec=spec,
        name=spec.name,
        queue=RequestQueue(config.deadline_boost),
        pinned=spec.pinned,
        family=(spec.instance_of or spec.name) if spec.instances > 1 else None,
    )


def changed(core: Core, ev: BackendsChanged, out: list[Decision]) -> None:
    """Apply ``ev``: add, retire (remove) and replace backends."""
    added = False
    for spec in ev.added:
        b = core.backends.get(spec.name)
        if b is not None:
            # Removed and added back before it was gone: a replacement.
            _retire(core, b, spec, out)
            continue
        core.backends[spec.name] = new_backend(spec, core.config)
        core.touched.add(spec.name)
        added = True
    for name in ev.removed:
        b = core.backends.get(name)
        if b is not None:
            _retire(core, b, None, out)
    for spec in ev.replaced:
        b = core.backends.get(spec.name)
        if b is None:
            core.backends[spec.name] = new_backend(spec, core.config)
            added = True
        else:
            _retire(core, b, spec, out)
    if added:
        # Every visit of the backends keeps the order of their names.
        core.backends = dict(sorted(core.backends.items()))
    core.room_version += 1


def _retire(core: Core, b: Backend, spec: BackendSpec | None, out: list[Decision]) -> None:
    b.retiring = REMOVED if spec is None else CHANGED
    b.next_spec = spec
    core.retiring.add(b.name)
    if spec is None and b.state not in LOADED:
        _end_queued(core, b, out)
    core.touched.add(b.name)
    core.unsettled.add(b.name)
    # At once, before the pass plans: a stopped one must not be started
    # again with the spec it is leaving.
    settle(core, b, out)


def settle_touched(core: Core, out: list[Decision]) -> None:
    """:func:`settle` every retiring backend touched since the last pass."""
    if not core.retiring:
        return  # nearly always: one set test per pass
    for name in sorted(core.retiring & (core.touched | core.unsettled)):
        b = core.backends.get(name)
        if b is not None and b.retiring is not None:
            settle(core, b, out)


def settle(core: Core, b: Backend, out: list[Decision]) -> None:
    """Move a retiring backend on: drain, stop once idle, and once stopped,
    forget it (removed) or give it its new spec (replaced). Called for each
    backend touched since the last pass."""
    if b.retiring is None:
        return
    if b.state in (BackendState.STOPPED, BackendState.FAILED):
        _finish(core, b, out)
        return
    if b.state not in LOADED:
        return  # starting: settled again once ready; stopping: once stopped
    if b.running:
        if b.state is BackendState.READY:
            core.transition(b, Move.DRAIN, f"draining: {b.retiring}")
        return
    if b.next_spec is None:
        _end_queued(core, b, out)
    core.stop(b, b.retiring, out)


def _finish(core: Core, b: Backend, out: list[Decision]) -> None:
    spec = b.next_spec
    core.retiring.discard(b.name)
    if spec is None:
        _end_queued(core, b, out)
        del core.backends[b.name]
        for names in (core.touched, core.overtaken, core.unsettled, core.draining, core.ready):
            names.discard(b.name)
        core.occupying.discard(b.name)
        core.forget_fit(b)
        core.victim_of.pop(b.name, None)
    else:
        b.spec = spec
        b.pinned = spec.pinned
        b.family = (spec.instance_of or spec.name) if spec.instances > 1 else None
        b.profile = None
        b.profile_has_load = False
        b.learned_load_s = None
        b.retiring = None
        b.next_spec = None
        b.reason = f"stopped ({CHANGED}; starts anew when needed)"
        core.forget_fit(b)
        core.touched.add(b.name)
    core.room_version += 1


def _end_queued(core: Core, b: Backend, out: list[Decision]) -> None:
    while (req := b.queue.head()) is not None:
        core.end(
            req,
            404,
            "model_removed",
            f"the backend {b.name} (and its models) was removed from yard's configuration "
            "while this request waited",
            out,
        )

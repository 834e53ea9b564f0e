"""What the scheduler does when a backend becomes ready, fails, exits or stops,
when memory is measured, and when an operator loads, unloads or pins one.

Functions of the :class:`~yard.core.state.Core` they change; each appends its
decisions to ``out``. Out-of-memory is judged by :mod:`yard.core.failures`.
"""

from __future__ import annotations

from dataclasses import replace

from yard.core import failures, instances, reasons, resources, windows
from yard.core.decisions import Decision, Flag, ProfileRaised
from yard.core.events import (
    AdminForgetProfile,
    AdminLoad,
    AdminPin,
    AdminUnload,
    BackendExited,
    BackendLoading,
    BackendReady,
    BackendStopped,
    MemoryMeasured,
    ProfileMeasured,
)
from yard.core.lifecycle import LOADED, OCCUPYING, BackendState, Move, can_move
from yard.core.plans import Outcome
from yard.core.records import Backend
from yard.core.spec import HOST, Profile
from yard.core.state import Core


def loading(core: Core, ev: BackendLoading) -> None:
    b = core.backends.get(ev.backend)
    if b is not None and b.state is BackendState.STARTING:
        b.loading = ev.progress


def ready(core: Core, ev: BackendReady, now: float, out: list[Decision]) -> None:
    b = core.backends.get(ev.backend)
    if b is None or not can_move(b.state, Move.READY):
        return
    assert b.started_at is not None
    b.learned_load_s = now - b.started_at
    b.ready_at = now
    b.served = 0
    b.dispatched_since_ready = 0
    b.self_caused_start_failures = 0
    b.failed_starts.clear()
    b.gave_up = None
    b.last_used = now
    took = ""
    if ev.context is not None:
        b.served_context = ev.context
        if b.context is not None and ev.context != b.context:
            took = f"; the server took context {ev.context:,} (yard chose {b.context or 0:,})"
    if ev.slots is not None and ev.slots != b.slots:
        took += f"; the server has {ev.slots} slots (yard expected {b.slots})"
        b.parallel = ev.slots
    ready_why = f"ready after loading for {reasons.secs(b.learned_load_s)}{took}"
    core.transition(b, Move.READY, ready_why)
    windows.ready(core, b, now)
    if took:
        out.append(Flag(backend=b.name, reason=f"{b.name}: " + took.removeprefix("; ")))
    if b.unload_requested:
        unload(core, b, out)
    else:
        instances.rebind(core, b, out)


def start_failed(
    core: Core, name: str, detail: str, oom: bool, now: float, out: list[Decision]
) -> None:
    b = core.backends.get(name)
    if b is None or b.state is not BackendState.STARTING:
        return
    if oom and b.profile is None:
        first_start_failed(core, b, detail, now, out)
        return
    caused = failures.self_caused(b, core.occupants, now) if oom else None
    core.transition(b, Move.START_FAILED, f"failed to start: {detail}")
    if caused is not None and b.self_caused_start_failures == 0:
        b.self_caused_start_failures += 1
        raise_profile(core, b, caused, out)
        core.release(b)
        reject_if_unfit(core, b, out)
        return
    core.release(b)  # its waiting requests stay; the next start uses the raised profile
    b.want_load = False
    windows.start_failed(core, b, now)
    # Clients must not hang on a command that does not start: the requests
    # waiting for it fail now, with the detail. New requests try it again.
    msg = f"backend {name} failed to start: {detail}"
    for req in b.queue.ordered():
        core.end(req, 502, "backend_failed", msg, out)


def first_start_failed(
    core: Core, b: Backend, detail: str, now: float, out: list[Decision]
) -> None:
    """A start of ``b``, never measured, ran out of memory. Where yard chose its
    place or context (:func:`yard.core.failures.first_start_caused`) that is
    yard's doing: its waiting requests keep their place and the next start
    steps down (:func:`yard.core.failures.next_step`); where no step is left,
    or it was alone at its minimum on an empty device, the model does not fit
    and its requests get 503 ``does_not_fit`` with the figures."""
    caused = failures.self_caused(b, core.occupants, now) or failures.first_start_caused(
        b, core.occupants, core.devices
    )
    alone_now = not any(o is not b for d in b.primary for o in core.occupants(d))
    tried = reasons.start_tried(b.gpus or (HOST,), b.context, alone_now)
    b.failed_starts.add((b.gpus, b.context, alone_now))
    core.transition(b, Move.START_FAILED, f"failed to start: {detail}")
    step = failures.next_step(b, alone_now) if caused is not None else None
    figures = _free_figures(core, b)
    core.release(b)
    core.forget_fit(b)
    core.room_version += 1
    if step is not None:
        assert caused is not None
        b.self_caused_start_failures = step
        nxt = failures.ladder(b)[step]
        ranged = resources.offered(b.spec) is not None
        why = reasons.stepping_down(b.name, tried, caused, nxt.minimum and ranged, nxt.alone)
        out.append(Flag(backend=b.name, reason=why))
        b.reason = why
        return
    b.want_load = False
    windows.start_failed(core, b, now)
    msg = reasons.does_not_fit_after(b.name, tried, detail, figures, b.spec.prior)
    b.gave_up = (msg, {d: foreign for d, _usable, foreign in figures})
    for req in b.queue.ordered():
        core.end(req, 503, "does_not_fit", msg, out)


def _free_figures(core: Core, b: Backend) -> list[tuple[str, int, int]]:
    """(device, usable, foreign) of ``b``'s devices, for a refusal's figures."""
    return [(d, core.devices[d].spec.usable_bytes, core.devices[d].foreign) for d in b.primary]


def exited(core: Core, ev: BackendExited, now: float, out: list[Decision]) -> None:
    b = core.backends.get(ev.backend)
    if b is None:
        return
    detail = ev.detail or f"exit code {ev.exit_code}"
    if b.state is BackendState.STARTING:
        start_failed(core, b.name, detail, ev.oom, now, out)
        return
    if not can_move(b.state, Move.EXITED):
        return  # stopping: BackendStopped follows; stopped/failed: stale
    caused = failures.self_caused(b, core.occupants, now) if ev.oom else None
    victims = list(b.running.values())
    core.transition(b, Move.EXITED, f"exited on its own: {detail}")
    if caused is not None:
        raise_profile(core, b, caused, out)
    core.release(b)
    for req in victims:
        if caused is not None and not req.requeued:
            core.requeue(req, f"{b.name} ran out of memory because {caused}", out)
        else:
            msg = f"backend {b.name} failed: {detail}"
            if caused is not None:
                msg += " (out of memory; this request was already requeued once)"
            core.end(req, 502, "backend_failed", msg, out)
    if caused is not None:
        reject_if_unfit(core, b, out)


def stopped(core: Core, ev: BackendStopped) -> None:
    b = core.backends.get(ev.backend)
    if b is None or not can_move(b.state, Move.STOPPED):
        return
    core.transition(b, Move.STOPPED, f"stopped ({b.reason})")
    core.release(b)


def raise_profile(core: Core, b: Backend, why: str, out: list[Decision]) -> None:
    old = b.profile
    new = failures.raised_profile(b, core.occupants, core.devices, core.config)
    if old is None or new is None:
        return
    b.profile = new
    core.forget_fit(b)
    instances.share_profile(core, b)
    core.room_version += 1
    before = (old.gpu_bytes, old.host_bytes)
    after = (new.gpu_bytes, new.host_bytes)
    reason = reasons.profile_raised(b.name, why, before, after)
    out.append(ProfileRaised(backend=b.name, profile=new, reason=reason))


def reject_if_unfit(core: Core, b: Backend, out: list[Decision]) -> None:
    """After a profile grew: its waiting requests fail if it can never fit."""
    fits, why = core.fits_empty_machine(b)
    if not fits:
        for req in b.queue.ordered():
            core.end(req, 503, "does_not_fit", why, out)


def profile(core: Core, ev: ProfileMeasured, out: list[Decision]) -> None:
    b = core.backends.get(ev.backend)
    if b is None:
        return
    load = ev.load_s
    if load is None and b.profile is not None and b.profile_has_load:
        load = b.profile.load_s
    b.profile_has_load = load is not None
    core.forget_fit(b)
    b.profile = resources.learn(
        b.profile,
        Profile(
            gpu_bytes=ev.gpu_bytes,
            host_bytes=ev.host_bytes,
            load_s=load if load is not None else core.load_s(b),
            context=ev.context,
            gpu_per_token=ev.gpu_per_token,
            host_per_token=ev.host_per_token,
            parallel=ev.parallel,
            gpu_per_slot=ev.gpu_per_slot,
            host_per_slot=ev.host_per_slot,
        ),
    )
    if b.state in OCCUPYING and b.devices:
        b.reserved = core.need_running(b)
        b.measuring = False
    instances.share_profile(core, b)
    reject_if_unfit(core, b, out)


def memory(core: Core, ev: MemoryMeasured, now: float, out: list[Decision]) -> None:
    """A meter reading of one device: live use per backend, foreign use; a
    backend seen above its profile is flagged (once), and its profile raised
    to what it uses (:func:`raise_to_live`)."""
    dev = core.devices.get(ev.device)
    if dev is None:
        return
    if ev.by_delta and dev.spec.per_process:
        # Sticky: a meter that lost per-process figures once may lose them
        # again, and a first load measured next to others by deltas is wrong.
        dev.spec = replace(dev.spec, per_process=False)
        core.touched_devices.add(ev.device)
        core.room_version += 1
        out.append(Flag(reason=reasons.fell_back_to_deltas(ev.device)))
    total = 0
    changed = False  # in what planning reads: memory held, foreign use
    above: list[tuple[Backend, int, int]] = []
    for name, nbytes in ev.backends:
        total += nbytes
        b = core.backends.get(name)
        if b is None or b.state not in OCCUPYING or ev.device not in b.devices:
            continue  # a late reading of a stopped backend, or of a stranger
        before = b.held(ev.device)
        b.live[ev.device] = nbytes
        changed = changed or b.held(ev.device) != before
        if b.profile is not None and not b.measuring:
            # At the context and slot count it runs with (optional resources).
            figures = resources.at(b.profile, b.context, b.parallel)
            limit = figures.gpu_bytes if ev.device != HOST else figures.host_bytes
            if failures.meaningfully_above(nbytes, limit):
                above.append((b, nbytes, limit))
                if b.overcommit is None:
                    b.overcommit = reasons.above_profile(nbytes, ev.device, limit)
                    out.append(Flag(backend=b.name, reason=f"{b.name}: {b.overcommit}"))
    dev.used = ev.used_bytes
    foreign = max(0, ev.used_bytes - total)
    if foreign != dev.foreign or changed:
        core.touched_devices.add(ev.device)
    dev.foreign = foreign
    usable = dev.spec.usable_bytes
    committed = sum(o.held(ev.device) for o in core.occupants(ev.device))
    if ev.used_bytes > usable or committed + dev.foreign > usable:
        why = reasons.over_committed(ev.device, max(ev.used_bytes, committed + dev.foreign), usable)
        flagged = [o.name for o in core.occupants(ev.device) if o.overcommit is None]
        for o in core.occupants(ev.device):
            if o.overcommit is None:
                o.overcommit = why
        if flagged:
            out.append(Flag(reason=f"{why}; running there: {', '.join(flagged)}"))
    for b, nbytes, limit in above:
        raise_to_live(core, b, ev.device, nbytes, limit, now, out)


def raise_to_live(
    core: Core, b: Backend, device: str, nbytes: int, limit: int, now: float, out: list[Decision]
) -> None:
    """``b`` was seen using ``nbytes`` on ``device``, above the ``limit`` its
    profile gives there: the profile (at the context it runs with) takes that
    figure, its reservation grows to match, and a ``ProfileRaised`` tells the
    engine to store it. It is the profile's new measured point: it keeps the
    load time the scheduler uses for it (now counted as measured)."""
    assert b.profile is not None
    old = b.profile
    at = resources.at(old, b.context, b.parallel)
    load = core.load_s(b)
    if device == HOST:
        point = replace(at, host_bytes=nbytes, load_s=load)
    else:
        point = replace(at, gpu_bytes=nbytes, load_s=load)
    b.profile_has_load = True
    core.forget_fit(b)
    b.profile = resources.learn(old, point)
    b.reserved = core.need_running(b)
    b.measuring = False
    instances.share_profile(core, b)
    core.room_version += 1
    reject_if_unfit(core, b, out)
    windows.profile_changed(core, b.name, now)
    why = reasons.above_profile(nbytes, device, limit)
    before = (old.gpu_bytes, old.host_bytes)
    after = (b.profile.gpu_bytes, b.profile.host_bytes)
    reason = reasons.profile_raised_live(b.name, why, before, after)
    out.append(ProfileRaised(backend=b.name, profile=b.profile, reason=reason))


def admin_load(core: Core, ev: AdminLoad, now: float, out: list[Decision]) -> None:
    b = core.backends.get(ev.backend)
    if b is None:
        out.append(Flag(reason=f"admin load: no backend named {ev.backend!r}"))
        return
    if b.state not in (BackendState.STOPPED, BackendState.FAILED):
        out.append(Flag(backend=b.name, reason=f"admin load: {b.name} is {b.state.value}"))
        return
    if instances.awaits_profile(b):
        first = b.spec.instance_of
        why = (
            f"it waits for the first load of {first}, which measures the profile every "
            f"instance shares; load {first} first"
        )
        out.append(Flag(backend=b.name, reason=f"admin load: not loading {b.name} now: {why}"))
        return
    plan = core.best_plan(b, None, {}, set(), set(), now)
    if plan is None or plan.status != Outcome.START:
        why = plan.reason if plan is not None else reasons.no_place(b.name)
        kept = ""
        if plan is not None and plan.status == Outcome.WAIT:
            # Another load on its devices, or memory being freed: the
            # operator's load is kept, and made once it can be.
            b.want_load = True
            core.loans.pop(b.name, None)  # the operator's wish now, not a give-back's
            core.room_version += 1
            kept = "; it loads once it can (POST .../unload withdraws it)"
        out.append(
            Flag(backend=b.name, reason=f"admin load: not loading {b.name} now: {why}{kept}")
        )
        return
    core.start(plan, now, out)


def admin_unload(core: Core, ev: AdminUnload, out: list[Decision]) -> None:
    b = core.backends.get(ev.backend)
    if b is None:
        out.append(Flag(reason=f"admin unload: no backend named {ev.backend!r}"))
        return
    if b.pinned:
        out.append(Flag(backend=b.name, reason=f"admin unload: {b.name} is pinned; unpin it"))
        return
    b.want_load = False
    core.loans.pop(b.name, None)  # nor is its room given back
    if b.state is BackendState.STARTING:
        b.unload_requested = True
        return
    if b.state not in LOADED:
        out.append(Flag(backend=b.name, reason=f"admin unload: {b.name} is {b.state.value}"))
        return
    unload(core, b, out)


def unload(core: Core, b: Backend, out: list[Decision]) -> None:
    b.unload_requested = False
    if not b.running:
        core.stop(b, "unloaded by an operator", out)
        return
    if b.state is BackendState.READY:
        core.transition(b, Move.DRAIN, "unloading once its requests finish (operator)")
    b.drain_reason = "admin"


def forget(core: Core, ev: AdminForgetProfile) -> None:
    b = core.backends.get(ev.backend)
    if b is not None:
        b.profile = None
        b.profile_has_load = False
        b.gave_up = None
        b.self_caused_start_failures = 0
        core.forget_fit(b)
        instances.share_profile(core, b)


def admin_pin(core: Core, ev: AdminPin, now: float, out: list[Decision]) -> None:
    b = core.backends.get(ev.backend)
    if b is None:
        out.append(Flag(reason=f"admin pin: no backend named {ev.backend!r}"))
        return
    b.pinned = ev.pinned
    b.want_load = ev.pinned and b.state not in OCCUPYING
    core.loans.pop(b.name, None)  # the operator's say from now on
    if ev.pinned and b.state is BackendState.DRAINING and b.drain_reason == "admin":
        core.transition(b, Move.UNDRAIN, "pinned again")
        b.drain_reason = None
    if b.want_load and b.family is not None and not instances.awaits_profile(b):
        # An instance pinned where it fits only by evicting a sibling stays
        # stopped (the planner refuses siblings as victims): say so now.
        plan = core.best_plan(b, None, {}, set(), set(), now)
        if plan is None or plan.status == Outcome.BLOCKED:
            why = plan.reason if plan is not None else reasons.no_place(b.name)
            text = f"admin pin: {b.name} is pinned; not loading it now: {why}"
            out.append(Flag(backend=b.name, reason=text))

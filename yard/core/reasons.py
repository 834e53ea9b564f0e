"""The human-readable reasons the core gives, built apart from the policy.

Every decision and every view carries a sentence that says why; the API, the
dashboard and the decision log show them as they are. The policy modules decide,
then call one of these functions with the figures; nothing here decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from yard.core.spec import Prior

_GIB = 1024**3


def gib(n: float) -> str:
    """Bytes as GiB with one decimal: ``12.0 GiB``."""
    return f"{n / _GIB:.1f} GiB"


def secs(s: float) -> str:
    """Seconds, one decimal below 100: ``4.5 s``, ``120 s``."""
    return f"{s:.1f} s" if s < 100 else f"{s:.0f} s"


# -- arrivals -------------------------------------------------------------------------


def unknown_backend(name: str, known: Sequence[str]) -> str:
    return f"no backend named {name!r} (known: {', '.join(known) or 'none'})"


def queue_full(queued: int, limit: int, retry_s: float) -> str:
    return (
        f"{queued} requests are waiting (queue_limit {limit}); try again in about {secs(retry_s)}"
    )


def deadline_infeasible(cost: float, how: str, late: float) -> str:
    return (
        f"the earliest possible start is in {secs(cost)} ({how}), "
        f"{secs(late)} after the requested start-by"
    )


def no_gpus(name: str, count: int, gpus: Sequence[str], present: Sequence[str]) -> str:
    return (
        f"{name} needs {count} of the GPUs {', '.join(gpus)}; "
        f"this machine has: {', '.join(present) or 'none'}"
    )


def too_big(name: str, short: Sequence[tuple[str, int, int]]) -> str:
    """``short``: (device, bytes needed, usable bytes) for each device it exceeds."""
    worst = "; ".join(f"needs {gib(n)} on {d}, usable {gib(u)}" for d, n, u in short)
    return f"{name} does not fit even on an empty machine: {worst}"


def start_tried(devices: Sequence[str], context: int | None, alone: bool) -> str:
    where = "+".join(devices)
    at = f" at context {context:,}" if context is not None else ""
    company = "alone" if alone else "next to other backends"
    return f"on {where}{at}, {company}"


def stepping_down(name: str, tried: str, caused: str, minimum: bool, alone: bool) -> str:
    nxt = "at its minimum context" if minimum else "as placed"
    if alone:
        nxt += ", alone on its devices"
    return (
        f"{name} ran out of memory starting {tried}: yard's doing ({caused}); its requests "
        f"keep their place and the next start is {nxt}"
    )


def does_not_fit_after(
    name: str,
    tried: str,
    detail: str,
    figures: Sequence[tuple[str, int, int]],
    prior: Prior | None,
) -> str:
    """``figures``: (device, usable bytes, bytes other processes held) of each
    device it tried."""
    room = "; ".join(
        f"{d}: {gib(u)} usable, {gib(f)} held by other processes" for d, u, f in figures
    )
    text = f"{name} does not fit: it ran out of memory starting {tried} ({room})"
    if prior is not None:
        p = prior.profile
        text += (
            f"; estimated from {prior.source}: {gib(p.gpu_bytes)} GPU / "
            f"{gib(p.host_bytes)} host at {p.context or 0:,} tokens"
        )
    return f"{text}; its last start: {detail}"


def too_big_estimated(name: str, short: Sequence[tuple[str, int, int]], source: str) -> str:
    """As :func:`too_big`, for a backend never measured, judged by its prior."""
    worst = "; ".join(f"about {gib(n)} on {d}, usable {gib(u)}" for d, n, u in short)
    return (
        f"{name} does not fit even on an empty machine at its smallest context, "
        f"as estimated from {source}: {worst}"
    )


# -- estimates ------------------------------------------------------------------------


def ready_free(name: str) -> str:
    return f"{name} is ready with a free slot"


def ready_busy(name: str, service_s: float) -> str:
    return f"{name} is busy; a slot frees in about {secs(service_s)}"


def loading_left(name: str, left_s: float) -> str:
    return f"{name} is loading, about {secs(left_s)} left"


def load_after(name: str, load_s: float, free_wait_s: float) -> str:
    text = f"loading {name} takes about {secs(load_s)}"
    if free_wait_s > 0:
        text += f" after about {secs(free_wait_s)} to free memory"
    return text


def overtake_denied(victim: str, service_hi_s: float, swap: str, latest_in_s: float) -> str:
    when = f"in {secs(latest_in_s)}" if latest_in_s > 0 else "now: its start-bys need it"
    return (
        f"a request for {victim} could take {secs(service_hi_s)}, "
        f"past the latest start of the swap to {swap} ({when})"
    )


# -- placement ------------------------------------------------------------------------


def claimed(device: str) -> str:
    return f"waiting for {device}: it is being prepared for a request that ranks higher"


def one_load_at_a_time(device: str, loader: str) -> str:
    return f"waiting for {device}: {loader} is loading there (one load at a time)"


def must_load_alone(where: str, name: str, why_not: str) -> str:
    return f"waiting for {where}: {name} must load alone there and {why_not}"


def not_a_victim_pinned(name: str) -> str:
    return f"{name} is pinned"


def not_a_victim_state(name: str, state: str) -> str:
    return f"{name} is {state}"


def not_a_victim_taken(name: str) -> str:
    return f"{name} is already making room for another swap"


def not_a_victim_outranks(name: str) -> str:
    return f"requests for {name} rank higher"


def not_a_victim_sibling(name: str) -> str:
    return f"{name} is another instance of the same backend (one never makes room for another)"


def no_room(device: str, name: str, need: int, free: int, blockers: Sequence[str]) -> str:
    text = f"waiting for {device}: {name} needs {gib(need)}, {gib(max(0, free))} free"
    if blockers:
        text += "; cannot make room: " + ", ".join(blockers)
    return text


def placed(where: str, figures: Sequence[tuple[str, int, int]], measured: bool) -> str:
    """``figures``: (device, need, free now) for each device of the placement."""
    fig = ", ".join(
        f"{d}: needs {gib(n)}, {gib(f)} free" if measured else f"{d}: {gib(f)} free, no profile yet"
        for d, n, f in figures
    )
    return f"placed on {where} ({fig})"


def wait_for_stopping(stopping: Sequence[str], where: str) -> str:
    return f"waiting for {', '.join(stopping) or 'memory'} to stop and free memory on {where}"


def serves_more_first(name: str, more: int) -> str:
    return f"{name} serves up to {more} more first"


def serves_first_since_loading(name: str) -> str:
    return f"{name} serves its first request since loading first"


def serves_before_due(name: str, left_s: float) -> str:
    return f"{name} serves what is expected to end before the load is due ({in_s(left_s)})"


def busy_must_finish(name: str) -> str:
    return f"busy {name} must finish before the swap"


def holding_idle(name: str, left_s: float) -> str:
    return f"holding idle {name} (no new work; stopped when the load is due, {in_s(left_s)})"


def holding_for_room(name: str, room: str) -> str:
    return f"held for {name}: no new work until its load is due ({room})"


def chosen_to_go(moves: bool) -> str:
    """What chose an idle backend to make room (the order of
    :func:`yard.core.victims.evict_key`): ``moves``, it may load on another GPU
    set as well and goes first, by GreedyDual-Size credit; else its recent
    arrival rate times its reload cost per GiB (:func:`yard.core.victims.demand`)."""
    if moves:
        return "may load on another GPU too: lowest GreedyDual-Size credit"
    return "least demand: fewest recent requests for its reload cost"


def stopping_idle(name: str, load_s: float, moves: bool) -> str:
    return f"stopping idle {name} ({chosen_to_go(moves)}; reloads in {secs(load_s)})"


def context_fixed(context: int, span: tuple[int, int], first: bool) -> str:
    low, high = span
    if first:
        return f"context {context} (of {low}-{high}): its maximum, measured on this first load"
    return (
        f"context {context} (of {low}-{high}): the one measured so far; a second measured "
        "context (yard probe measures both ends) lets yard choose"
    )


def context_chosen(context: int, span: tuple[int, int]) -> str:
    low, high = span
    if context == high:
        return f"context {context} (of {low}-{high}): its maximum fits"
    if context == low:
        return f"context {context} (of {low}-{high}): only its minimum fits next to the others"
    return f"context {context} (of {low}-{high}): the largest that fits next to the others"


def context_stepped_down(context: int, span: tuple[int, int]) -> str:
    low, high = span
    return (
        f"context {context} (of {low}-{high}): its minimum, since a larger start ran out of memory"
    )


def trained_cap(top: int, span: tuple[int, int]) -> str:
    return (
        f"not above {top:,} tokens, the context the model was trained for (llama-server caps "
        f"a slot there; {span[1]:,} would hold memory no request can use)"
    )


def estimated(source: str, nbytes: int, context: int | None, device: str) -> str:
    at = f" at {context:,} tokens" if context is not None else ""
    return f"estimated from {source}: {gib(nbytes)}{at} on {device}, until measured"


def fell_back_to_deltas(device: str) -> str:
    return (
        f"{device}: the meter fell back to device deltas (it cannot tell the backends apart "
        "there now); first loads there are measured alone from now on"
    )


def _slots(n: int) -> str:
    return f"{n} slot" if n == 1 else f"{n} slots"


def parallel_fixed(parallel: int, span: tuple[int, int], first: bool) -> str:
    low, high = span
    if first:
        return f"{_slots(parallel)} (of {low}-{high}): its maximum, measured on this first load"
    return (
        f"{_slots(parallel)} (of {low}-{high}): the count measured so far; a second measured "
        "count (yard probe measures both ends) lets yard choose"
    )


def parallel_chosen(parallel: int, span: tuple[int, int]) -> str:
    low, high = span
    if parallel == high:
        return f"{_slots(parallel)} (of {low}-{high}): its maximum fits"
    if parallel == low:
        return f"{_slots(parallel)} (of {low}-{high}): only its minimum fits next to the others"
    return f"{_slots(parallel)} (of {low}-{high}): the most that fit next to the others"


def parallel_after_context(parallel: int, span: tuple[int, int]) -> str:
    low, high = span
    return (
        f"{_slots(parallel)} (of {low}-{high}): its minimum, since the context grows first "
        "and is below its maximum"
    )


def first_load(alone: bool) -> str:
    if alone:
        return "first load: measured alone"
    return "first load: measured next to the others, the meter tells their memory apart"


def room_unmeasured(device: str, name: str) -> str:
    return f"{device}: {name} has no profile yet and loads alone to be measured"


def room_short(device: str, name: str, need: int, free: int) -> str:
    return f"{device}: {name} needs {gib(need)}, {gib(max(0, free))} free"


def evicting(room: str, parts: Sequence[str]) -> str:
    return f"waiting for {room}; " + "; ".join(parts)


# -- the pass -------------------------------------------------------------------------


def stopping_for_room(name: str, room: str, victim_load_s: float, moves: bool) -> str:
    return (
        f"making room for {name} ({room}); idle, {chosen_to_go(moves)} "
        f"(reloads in {secs(victim_load_s)})"
    )


def lent_room(app: str, victim: str, borrower: str) -> str:
    """What a stop adds where it lends the room (:mod:`yard.core.lending`)."""
    return (
        f"; {app} is ahead of its share: {victim}'s room is lent, and {victim} is "
        f"loaded back once {borrower} has nothing to do"
    )


def giving_back(name: str, borrower: str, app: str) -> str:
    """Why a backend loads for no request where its lent room is given back."""
    return (
        f"giving {name} its room back: it was stopped for {borrower} for {app}, an app "
        f"ahead of its share, and {borrower} has nothing to do"
    )


def draining_for_room(name: str, room: str) -> str:
    return f"draining to make room for {name} ({room})"


def serving_before_swap(name: str) -> str:
    return f"serving a few more before the swap to {name}"


def waiting_for_stop(name: str) -> str:
    return f"waiting for {name} to finish stopping before it loads again"


def no_place(name: str) -> str:
    return f"{name} has no place on this machine"


def start_why(name: str, waiting: int, head: tuple[str, float] | None, pinned: bool) -> str:
    """Why a backend is loaded: ``waiting`` requests wait (``head``: the next one's
    id and priority), else it is pinned, else an operator asked for it."""
    if head is not None:
        return f"{waiting} request(s) waiting for {name} (next: {head[0]}, priority {head[1]:g})"
    if pinned:
        return f"{name} is pinned"
    return f"{name} was asked for"


def dispatched(
    name: str,
    busy: int,
    slots: int,
    request_id: str,
    priority: float,
    effective: float,
    waited_s: float,
) -> str:
    return (
        f"{name} had a free slot (now {busy}/{slots} busy); "
        f"{request_id} priority {priority:g}, effective {effective:.1f}, "
        f"waited {secs(waited_s)}"
    )


def overtakes_swap(head_id: str, swap: str, used: int, bound: int) -> str:
    return f"; goes ahead of {head_id}'s swap to {swap} (overtake {used} of {bound})"


def ends_before_load(swap: str, left_s: float) -> str:
    return f"; expected to end before {swap}'s load is due ({in_s(left_s)})"


FIRST_BEFORE_SWAP = "; the first since it loaded, before it makes room for a swap"


def idle_stop(idle_s: float, ttl: float) -> str:
    return f"idle for {secs(idle_s)} (idle_ttl_s {ttl:g})"


def deadline_missed(waited_s: float, why_waiting: str) -> str:
    return f"its start-by deadline passed after {secs(waited_s)} in the queue ({why_waiting})"


def lost_no_exit(name: str, grace_s: float) -> str:
    return f"the connection to backend {name} broke and no exit was reported within {secs(grace_s)}"


# -- failures and memory --------------------------------------------------------------


def above_profile(used: int, device: str, limit: int) -> str:
    return f"it used {gib(used)} on {device}, above its profile {gib(limit)}"


def over_committed(device: str, held: int, usable: int) -> str:
    return f"{device} was over-committed ({gib(held)} in use or reserved, {gib(usable)} usable)"


def profile_raised(name: str, why: str, old: tuple[int, int], new: tuple[int, int]) -> str:
    return (
        f"{name} ran out of memory because {why}; profile raised from "
        f"{gib(old[0])} GPU / {gib(old[1])} host to {gib(new[0])} / {gib(new[1])}"
    )


def profile_raised_live(name: str, why: str, old: tuple[int, int], new: tuple[int, int]) -> str:
    return (
        f"{name}: {why}; profile raised from "
        f"{gib(old[0])} GPU / {gib(old[1])} host to {gib(new[0])} / {gib(new[1])}"
    )


def shared_and_outgrew(device: str, others: Sequence[str]) -> str:
    return (
        f"it shared {device} with {', '.join(others)} and together they outgrew it "
        "(a profile proved too small)"
    )


# -- views ----------------------------------------------------------------------------


def behind(ahead: int, name: str) -> str:
    if not ahead:
        return ""
    return f"behind {ahead} request(s) of higher effective priority for {name}; "


def held_back(name: str, swap_to: str, head_id: str, bound: int) -> str:
    return (
        f"held back: {name} will be swapped out for {swap_to} "
        f"({head_id} waits; {bound} overtakes used)"
    )


def waiting_for_slot(name: str, busy: int, slots: int, service_s: float) -> str:
    return f"waiting for a free slot on {name} ({busy}/{slots} busy, est. {secs(service_s)})"


def app_at_limit(app: str, serving: int, limit: int) -> str:
    return (
        f"app {app!r} has {serving} requests being served, the most "
        f"[apps.{app}] max_concurrent = {limit} allows; it goes when one of them ends"
    )


# -- work ahead (yard.core.windows) ------------------------------------------


def in_s(s: float) -> str:
    return f"in {secs(s)}" if s > 0 else "now"


def held_until(label: str) -> str:
    return f"held until {label}"


def held_for(left_s: float) -> str:
    return f"held for {secs(max(0.0, left_s))} more (not before)"


def _ahead_work(announced: int, held: int) -> str:
    parts = []
    if announced:
        parts.append(f"{announced} announced request{'s' if announced != 1 else ''}")
    if held:
        parts.append(f"{held} held request{'s' if held != 1 else ''}")
    return " and ".join(parts) or "announced work"


def loading_ahead(name: str, announced: int, held: int, when: str, window: str) -> str:
    return f"loading {name} now: {_ahead_work(announced, held)} from {when} ({window})"


def ahead_urgent(load_s: float, when: str) -> str:
    """Why a load for work ahead no longer waits for the work it makes room
    for: the window counts as a start-by (:mod:`yard.core.windows`)."""
    return (
        f"; urgent: its {secs(load_s)} load must start in time for {when}, "
        "so what it evicts takes no new work that would run past it"
    )


def ahead_early(when: str) -> str:
    """Why a load for work ahead comes before it is due: what it evicts is
    expected to stay idle until then (:mod:`yard.core.windows`)."""
    return f"; early: what it evicts is expected to stay idle until {when}"


def keeping_ahead(name: str, announced: int, held: int, when: str, load_s: float) -> str:
    return (
        f"keeping {name}: {_ahead_work(announced, held)} from {when} "
        f"is within its {secs(load_s)} reload time"
    )


def beyond_slots(names: Sequence[str], slots: int) -> str:
    """Why a further instance is readied for work ahead: the work is more than
    the slots of the instances before it (``names``)."""
    plural = "s" if slots != 1 else ""
    if len(names) == 1:
        return f"more than {names[0]}'s {slots} slot{plural}"
    return f"more than the {slots} slot{plural} of {', '.join(names)}"


def announcement_matched(request_id: str, announcement: str, left: int) -> str:
    return f"{request_id}: matches announcement {announcement} ({left} left)"


def announcement_ended(aid: str, backend: str, outcome: str, used: int, count: int) -> str:
    return f"announcement {aid} for {backend} {outcome}: {used} of {count} requests came"


def patient(request_id: str, starts_in_s: float, lead_s: float, slots: int) -> str:
    """A request with a start-by far off ages only from its latest comfortable start."""
    slot = ", and it leaves free slots to other work that keeps coming" if slots > 1 else ""
    return (
        f"{request_id}: its start-by is far off: it ages from its latest comfortable start, "
        f"{in_s(starts_in_s)} ({secs(lead_s)} before its start-by); until then fresher work "
        f"of higher priority goes first{slot}"
    )

"""What a run is judged by: deadlines, waits, loads against their lower bounds, GPU
time, out-of-memory kills.

Definitions (docs/simulation.md repeats them for readers of the report):

- A deadline is met when the request's first dispatch is at or before its start-by.
  A miss is *unavoidable* when even an idle machine could not have started it in
  time: its start-by came sooner after arrival than its model's shortest load
  (or had passed already), and the model was not loaded when it arrived. Every other
  miss is *avoidable*. Requests their client cancelled before dispatch do not count.
- Wait: first dispatch minus arrival, for requests that were dispatched.
- Loads: backend starts. References, for the run's own dispatch order:
  *compulsory* (each backend used loads once: a true lower bound) and *Belady by
  size* (offline, knowing the whole future: on a miss, evict what is used furthest
  ahead until the peak footprint fits, then keep back any victim not needed after
  all; loads are instant and never wait for running work). With sizes that differ,
  optimal offline eviction is NP-hard, so Belady by size is a strong reference, not
  a proof: a policy can beat it.
- GPU shares: the fraction of GPU time spent loading, and idle while a request that
  could use that GPU waited.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sim.runner import RequestRecord, SimResult

CLASSES = ("high", "normal", "low")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def belady_loads(
    order: Sequence[str],
    sizes: Mapping[str, int],
    gpus_of: Mapping[str, tuple[str, ...]],
    capacity: Mapping[str, int],
) -> int:
    """Loads needed to serve ``order`` (backend per dispatch) with Belady's eviction
    by size: on a miss, on the GPU where it hurts least, evict the backends used
    furthest in the future until the new one fits."""
    seq = [b for i, b in enumerate(order) if i == 0 or order[i - 1] != b]
    never = len(seq)
    next_use = [never] * len(seq)
    upcoming: dict[str, int] = {}
    for i in range(len(seq) - 1, -1, -1):
        next_use[i] = upcoming.get(seq[i], never)
        upcoming[seq[i]] = i
    resident: dict[str, dict[str, int]] = {g: {} for g in capacity}  # gpu -> backend -> next
    where: dict[str, str] = {}
    loads = 0
    for i, backend in enumerate(seq):
        if backend in where:
            resident[where[backend]][backend] = next_use[i]
            continue
        loads += 1
        need = sizes[backend]
        best: tuple[tuple[int, int], str, list[str]] | None = None
        for gpu in gpus_of[backend]:
            cache = resident[gpu]
            free = capacity[gpu] - sum(sizes[b] for b in cache)
            victims: list[str] = []
            for other in sorted(cache, key=lambda b: -cache[b]):
                if free >= need:
                    break
                victims.append(other)
                free += sizes[other]
            if free < need:
                continue
            # Greedy eviction can take a small backend it did not need to (the big
            # one after it made room alone): keep back every victim still not needed,
            # the soonest used first.
            for other in sorted(victims, key=lambda b: cache[b]):
                if free - sizes[other] >= need:
                    victims.remove(other)
                    free -= sizes[other]
            soonest = min((cache[v] for v in victims), default=never + 1)
            key = (-soonest, len(victims))
            if best is None or key < best[0]:
                best = (key, gpu, victims)
        if best is None:
            continue  # larger than any GPU: never served
        _, gpu, victims = best
        for victim in victims:
            del resident[gpu][victim]
            del where[victim]
        resident[gpu][backend] = next_use[i]
        where[backend] = gpu
    return loads


def app_metrics(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Per app (requests with an app name): ``app_NAME_requests``, its waits
    (``app_NAME_wait_p50_s``, ``_p95_s``, ``_max_s``), ``app_NAME_served_s`` (the
    service time of its requests served to the end: the slot time it was given)
    and ``app_NAME_rejected``."""
    by_app: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.arrival.app:
            by_app.setdefault(r.arrival.app, []).append(r)
    out: dict[str, float] = {}
    for app, rs in sorted(by_app.items()):
        waits = [r.dispatches[0] - r.arrival.at for r in rs if r.dispatches]
        out[f"app_{app}_requests"] = len(rs)
        for q, name in ((0.50, "p50"), (0.95, "p95")):
            out[f"app_{app}_wait_{name}_s"] = round(percentile(waits, q), 3)
        out[f"app_{app}_wait_max_s"] = round(max(waits, default=0.0), 3)
        out[f"app_{app}_served_s"] = round(
            sum(r.arrival.service_s for r in rs if r.outcome == "ok"), 3
        )
        out[f"app_{app}_rejected"] = sum(r.outcome == "rejected" for r in rs)
    return out


def apps_in(row: Mapping[str, float]) -> list[str]:
    """The app names a row of :func:`metrics` has figures for."""
    return sorted(
        k.removeprefix("app_").removesuffix("_requests")
        for k in row
        if k.startswith("app_") and k.endswith("_requests")
    )


def metrics(result: SimResult) -> dict[str, float]:
    """The figures of one run, by the names of ``python -m sim report --json``."""
    scenario = result.scenario
    models = {m.name: m for m in scenario.models}
    out: dict[str, float] = {}
    records = result.records
    out["requests"] = len(records)
    out["ok"] = sum(r.outcome == "ok" for r in records)
    out["rejected"] = sum(r.outcome == "rejected" for r in records)
    out["cancelled"] = sum(r.outcome == "cancelled" for r in records)
    out["stuck"] = len(result.stuck)

    met = missed = avoidable = 0
    for r in records:
        start_by = r.arrival.start_by
        if start_by is None or (r.outcome == "cancelled" and not r.dispatches):
            continue
        if r.dispatches and r.dispatches[0] <= start_by + 1e-9:
            met += 1
            continue
        missed += 1
        model = models[r.arrival.backend]
        shortest_load = model.load_s * (1 - model.load_jitter)
        slack = start_by - r.arrival.at
        if slack < 0 or (not r.ready_at_arrival and slack < shortest_load):
            continue
        avoidable += 1
    out["deadlines_met"] = met
    out["deadlines_missed"] = missed
    out["deadlines_missed_avoidable"] = avoidable

    waits: dict[str, list[float]] = {c: [] for c in CLASSES}
    for r in records:
        if r.dispatches:
            waits.setdefault(r.arrival.cls, []).append(r.dispatches[0] - r.arrival.at)
    everything = [w for ws in waits.values() for w in ws]
    for prefix, values in [("", everything), *((f"{c}_", waits[c]) for c in CLASSES)]:
        out[f"{prefix}wait_p50_s"] = round(percentile(values, 0.50), 3)
        out[f"{prefix}wait_p95_s"] = round(percentile(values, 0.95), 3)
        out[f"{prefix}wait_max_s"] = round(max(values, default=0.0), 3)

    # A request refused or failed (a peer's backend dying of OOM, a concurrency
    # limit) was never served: counted as an endless wait, so a policy cannot look
    # fast by failing its slowest requests. Cancelled ones are the client's doing.
    for cls in CLASSES:
        mine = [r for r in records if r.arrival.cls == cls and r.outcome != "cancelled"]
        failed = [r for r in mine if r.outcome == "rejected"]
        out[f"{cls}_failed"] = len(failed)
        waits_all = [
            r.dispatches[0] - r.arrival.at if r.outcome != "rejected" else math.inf
            for r in mine
            if r.dispatches or r.outcome == "rejected"
        ]
        out[f"{cls}_wait_p95_all_s"] = round(percentile(waits_all, 0.95), 3)

    out.update(app_metrics(records))

    out["loads"] = len(result.launches)
    order = [backend for _, backend in result.dispatch_order]
    out["loads_compulsory"] = len(set(order))
    capacity = {d.name: d.usable_bytes for d in scenario.machine.device_specs() if d.kind == "gpu"}
    out["loads_lower_bound"] = belady_loads(
        order,
        {m.name: m.peak_gpu_bytes for m in scenario.models},
        {m.name: m.gpus for m in scenario.models},
        capacity,
    )
    out["ooms"] = len(result.ooms)
    out["requeues"] = result.statistics.requeues

    totals = {"loading": 0.0, "serving": 0.0, "idle_with_work": 0.0, "idle": 0.0}
    for seconds in result.gpu_seconds.values():
        for state, value in seconds.items():
            totals[state] += value
    whole = sum(totals.values()) or 1.0
    out["gpu_loading_share"] = round(totals["loading"] / whole, 4)
    out["gpu_serving_share"] = round(totals["serving"] / whole, 4)
    out["gpu_idle_with_work_share"] = round(totals["idle_with_work"] / whole, 4)
    out["sim_seconds"] = round(result.end_time, 3)
    out["wall_s"] = round(result.wall_s, 3)
    return out

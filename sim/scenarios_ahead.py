"""Scenarios of work yard can see coming (issue 12): announced windows and batches.

- ``radio-day-Ngpu-announced``: the radio day (:func:`sim.scenarios.radio_day`) with
  the same requests, plus what a real newsroom does: at the top of each hour it
  announces that hour's news window (news-llm from :30 to :50, with the number of
  scripts it will send, priority 90) and its voice-over window (tts from :52 to
  :58). The breaking-news burst stays unannounced. Baselines see the same requests
  and no announcements (they have no way to take them). On two GPUs the station
  also runs news-llm as two instances (``instances = 2``: a copy fits on each GPU,
  :data:`NEWS_INSTANCES`); on one 24 GiB GPU a second 14.3 GiB copy does not fit
  beside the first, so it keeps one.
- ``batch-day-Ngpu``: a morning of listener chat (08:00 to 12:00 on the radio day's
  curve) and, at 08:30, one OpenAI batch of 1,000 lines over three models with a
  ``3h`` completion window (:func:`batch_lines`). ``batch-chat-only-Ngpu`` is the
  same morning without the batch; ``batch-alone-Ngpu`` the batch without the chat.
  The three share their draws: chat and batch are drawn in every variant and the
  variant keeps its part, so the chat requests of ``batch-day`` and
  ``batch-chat-only`` are the same, and the batch lines of ``batch-day`` and
  ``batch-alone``. ``batch-day-fed`` and ``batch-alone-fed``: the same, with the
  lines fed the way yard/batches really feeds them (below).

Batch lines are modelled the way the Batch API hands them in (``yard/batches``):
each line is a request of the batch's app, at the app's default priority minus
``[jobs] batch_priority_drop`` (30 - 10 = 20, against chat's 50), with a start-by of
the window's end minus the longest service time of its model (:data:`LINE_HIGH_S`,
what the service measures from the latest runs), no allow-late; the lines are
grouped by model in the order the models first appear in the file, and all of them
are handed in at one instant. The real service keeps at most ``[jobs]
batch_queued_lines`` = 64 lines open at once, feeds the rest as lines end, and on a
backend where no line has ended yet hands in no more than its slots: the ``-fed``
variants. Handing all 1,000 in at once is the harder case for the interactive
traffic: every line ages in the queue from the start.

Why a ``3h`` window and not ``24h``: the batch is about 1.5 hours of GPU work (see
:data:`BATCH_MODELS`); inside 24 hours any policy finishes it, and the targets
would not tell anything. Three hours is twice the work, on a GPU that chat keeps
busy: the window needs about half the capacity it gives.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import replace

from sim.scenarios import HOUR, MINUTE, chat_rate, radio_day
from sim.workload import Announcement, Arrival, Ids, Scenario, lognormal, poisson_times
from sim.world import LLAMA_CPP_SPEEDUP, GiB, MachineSpec, ModelSpec, with_instances

# -- the radio day, announced -------------------------------------------------------------

NEWS_WINDOW = (30 * MINUTE, 50 * MINUTE)
"""The hour's news scripts arrive from :30 to :35 and must start by :50."""
VOICE_WINDOW = (52 * MINUTE, 58 * MINUTE)
"""The voice-overs arrive from :52 to :54 and must start by :58."""


def newsroom_announcements(arrivals: Sequence[Arrival]) -> list[Announcement]:
    """What the newsroom announces at the top of each hour: the hour's news window
    and voice-over window, each with the number of requests it will send (counted
    from the workload, as the newsroom knows its own rundown).

    Only the scheduled news (priority 90) is announced; the breaking-news burst
    (priority 95) comes unannounced.
    """
    counts: dict[tuple[int, str], int] = {}
    for a in arrivals:
        if a.app == "newsroom" and a.priority == 90.0:
            hour = int(a.at // HOUR)
            counts[(hour, a.backend)] = counts.get((hour, a.backend), 0) + 1
    out: list[Announcement] = []
    for (hour, backend), count in sorted(counts.items()):
        base = hour * HOUR
        opens, closes = NEWS_WINDOW if backend == "news-llm" else VOICE_WINDOW
        out.append(
            Announcement(
                at=base,
                announcement_id=f"news-{hour:02d}-{backend}",
                backend=backend,
                app="newsroom",
                not_before=base + opens,
                start_by=base + closes,
                count=count,
                priority=90.0,
                label=_clock(base + opens),
            )
        )
    return out


def _clock(t: float) -> str:
    """The simulated day's wall-clock time of engine time ``t`` ("13:30")."""
    minutes = int(t // MINUTE)
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}"


NEWS_INSTANCES = {1: 1, 2: 2}
"""news-llm's instances on the announced day, by GPU count: one copy per GPU it fits
on (13 GiB at its peak, 14.3 GiB reserved with the profile margin, on 24 GiB GPUs:
one per GPU). The scripts of an hour queue behind each other on one instance's one
slot (:func:`sim.targets_ahead.one_instance_floor`); a second instance serves the
second script while the first serves the first."""


def radio_day_announced(gpu_count: int, hours: float = 24.0, *, spread: bool = False) -> Scenario:
    """The radio day on ``gpu_count`` GPUs with the newsroom's announcements, and
    news-llm as :data:`NEWS_INSTANCES` instances; ``spread``: with
    ``spread_windows = true`` (each hour's three announced scripts ready the
    second instance ahead too; name suffix ``-spread``)."""
    plain = radio_day(gpu_count, hours)
    count = NEWS_INSTANCES.get(gpu_count, 1)
    news = (replace(m, spread_windows=spread) if m.name == "news-llm" else m for m in plain.models)
    models = tuple(
        part for m in news for part in (with_instances(m, count) if m.name == "news-llm" else (m,))
    )
    title = f"{plain.title}, news windows announced"
    if count > 1:
        title += f", news-llm x {count}"
    if spread:
        title += " (spread_windows)"
    # The baselines cannot take announcements: their rows are the plain day's.
    return replace(
        plain,
        name=f"{plain.name}-announced" + ("-spread" if spread else ""),
        title=title,
        models=models,
        announcements=newsroom_announcements,
        policies=("yard",),
    )


# -- the radio day with news-llm's slots (one GPU) -------------------------------------------

NEWS_SLOT_BYTES = 5 * GiB // 4
"""What each news-llm slot beyond the first holds on the GPU: the KV cache of one
8,192-token context of a 12 B model with grouped-query attention (40 layers x 8 KV
heads x 128 dimensions x 2 (K and V) x 2 bytes = 160 KiB a token), as
``-c {total_context} -np {parallel}`` gives every slot its own context."""

FAST_SPEEDUP = (1.0, 1.6, 2.0)
"""A less conservative speed-up than :data:`sim.world.LLAMA_CPP_SPEEDUP` (quantized
weights on recent kernels): the sensitivity rows."""

SLOT_VARIANTS: dict[str, tuple[int, tuple[float, ...]]] = {
    "np2": (2, LLAMA_CPP_SPEEDUP),
    "np2-fast": (2, FAST_SPEEDUP),
    "np3": (3, LLAMA_CPP_SPEEDUP),
}
"""name: (news-llm's most slots, the speed-up of its concurrent scripts). Two slots,
not three: at its peak news-llm needs 15.7 GiB reserved with two slots (14.3 GiB with
one), which fits beside chat (4.95) and tts (2.5) on 23.75 usable GiB; three (17.0 GiB)
would not beside both (``np3``, by name only: on seed 2024 yard started news-llm once
with three slots, before tts was first loaded, and 13 times with two, with the same
waits as ``np2``)."""


def radio_day_slots(
    variant: str, gpu_count: int = 1, hours: float = 24.0, *, announced: bool = False
) -> Scenario:
    """The radio day on ``gpu_count`` GPUs with news-llm as a llama-server with a slot
    range (``parallel = { min = 1, max = N }`` of :data:`SLOT_VARIANTS`): yard starts
    it with as many slots as fit; the baselines run it with N (a fixed ``-np N``, as
    llama-swap's command or ``OLLAMA_NUM_PARALLEL`` would), told the size at N.
    ``announced``: with the newsroom's announcements (yard only, as
    :func:`radio_day_announced`)."""
    most, speedup = SLOT_VARIANTS[variant]
    plain = radio_day(gpu_count, hours)
    models = tuple(
        replace(m, parallel=(1, most), slot_bytes=NEWS_SLOT_BYTES, speedup=speedup)
        if m.name == "news-llm"
        else m
        for m in plain.models
    )
    title = (
        f"{plain.title}, news-llm with 1-{most} slots ({speedup[most - 1]:g}x together at {most})"
    )
    scenario = replace(plain, name=f"{plain.name}-{variant}", title=title, models=models)
    if not announced:
        return scenario
    return replace(
        scenario,
        name=f"{scenario.name}-announced",
        title=f"{title}, news windows announced",
        announcements=newsroom_announcements,
        policies=("yard",),
    )


_SLOTS_NAME = re.compile(r"radio-day-(\d+)gpu(?:-([\d.]+)h)?-(np\d+(?:-fast)?)(-announced)?")


def _slots_get(name: str) -> Scenario | None:
    match = _SLOTS_NAME.fullmatch(name)
    if match is None or match[3] not in SLOT_VARIANTS:
        return None
    return radio_day_slots(
        match[3], int(match[1]), float(match[2] or 24), announced=match[4] is not None
    )


# -- a batch handed in while chat runs ---------------------------------------------------

BATCH_AT = 30 * MINUTE
"""The batch is handed in at 08:30 (the simulation's 0 is 08:00)."""
BATCH_WINDOW_S = 3 * HOUR
"""The batch's ``completion_window``: ``3h`` (see the module's docstring)."""
CHAT_HOURS = 4.0
"""Listener chat from 08:00 to 12:00."""
DAY_OFFSET = 8 * HOUR
FED_LINES = 64
"""``[jobs] batch_queued_lines``'s default: the ``-fed`` variants hand the lines in as
yard/batches really does (:attr:`sim.workload.Scenario.batch_queued_lines`)."""
BATCH_PRIORITY = 20.0
"""The batch app's default priority (30) minus ``batch_priority_drop`` (10)."""

# (model, lines, mean service seconds): in the order the models first appear in
# the input file. About 1.5 h of GPU work: 350 x 12 s / 2 slots + 400 x 3 s / 4
# slots + 250 x 20 s / 2 slots = 2,100 + 300 + 2,500 s.
BATCH_MODELS: tuple[tuple[str, int, float], ...] = (
    ("summarize-llm", 350, 12.0),
    ("chat-llm", 400, 3.0),
    ("reason-llm", 250, 20.0),
)
LINE_HIGH_S = {name: 3 * mean for name, _, mean in BATCH_MODELS}
"""The service time the Batch API subtracts from the window's end to get a line's
start-by: the longest of the latest runs (three times the mean covers the
lognormal's tail)."""


def _batch_models(gpus: tuple[str, ...]) -> tuple[ModelSpec, ...]:
    """chat-llm (the interactive model, also one of the batch's), summarize-llm and
    reason-llm. On one 24 GiB GPU chat fits beside either of the others, but
    summarize-llm and reason-llm do not fit together."""
    return (
        ModelSpec(
            name="chat-llm",
            gpu_bytes=4 * GiB,
            load_s=12.0,
            warmup_extra_bytes=GiB // 2,
            growth_bytes=GiB // 2,
            slots=4,
            gpus=gpus,
        ),
        ModelSpec(
            name="summarize-llm",
            gpu_bytes=8 * GiB,
            host_bytes=2 * GiB,
            load_s=25.0,
            warmup_extra_bytes=GiB,
            growth_bytes=GiB,
            slots=2,
            gpus=gpus,
        ),
        ModelSpec(
            name="reason-llm",
            gpu_bytes=13 * GiB,
            host_bytes=3 * GiB,
            load_s=45.0,
            warmup_extra_bytes=GiB,
            growth_bytes=GiB,
            slots=2,
            gpus=gpus,
        ),
    )


def batch_lines(rng: random.Random, at: float, window_s: float) -> list[Arrival]:
    """One batch of :data:`BATCH_MODELS` lines, handed in at ``at``, in model order
    (a window shorter than :data:`BATCH_WINDOW_S` gets that many fewer lines).

    The input file lists the lines in a random order; the Batch API groups them by
    model, in the order each model first appears, keeping the file's order within a
    model. Each line: priority :data:`BATCH_PRIORITY`, start-by ``at + window_s``
    minus :data:`LINE_HIGH_S` of its model, app ``batch``, class ``batch``.
    """
    scale = window_s / BATCH_WINDOW_S
    names = [name for name, count, _ in BATCH_MODELS for _ in range(round(count * scale))]
    rng.shuffle(names)
    means = {name: mean for name, _, mean in BATCH_MODELS}
    first: dict[str, int] = {}
    for name in names:
        first.setdefault(name, len(first))
    services = [lognormal(rng, means[name], 0.4) for name in names]
    order = sorted(range(len(names)), key=lambda i: (first[names[i]], i))
    return [
        Arrival(
            at=at,
            request_id="",
            backend=names[i],
            priority=BATCH_PRIORITY,
            service_s=services[i],
            cls="batch",
            app="batch",
            start_by=at + window_s - LINE_HIGH_S[names[i]],
            batch="batch-1",
        )
        for i in order
    ]


def batch_day_workload(
    rng: random.Random, *, chat: bool = True, batch: bool = True, hours: float = CHAT_HOURS
) -> list[Arrival]:
    """The morning's chat (class ``normal``) and the batch (class ``batch``).

    Both are always drawn, chat first, so that every variant sees the same chat
    requests and the same batch lines; ``chat`` and ``batch`` say which to keep.
    ``hours`` shortens the morning (and the window with it) for tests.
    """
    scale = hours / CHAT_HOURS
    out: list[Arrival] = []
    for t in poisson_times(rng, 0.0, hours * HOUR, lambda t: chat_rate(t + DAY_OFFSET), 1.0):
        out.append(
            Arrival(
                at=t,
                request_id="",
                backend="chat-llm",
                priority=50.0,
                service_s=lognormal(rng, 2.5, 0.6),
                cls="normal",
                app="chat",
            )
        )
    lines = batch_lines(rng, BATCH_AT * scale, BATCH_WINDOW_S * scale)
    if not chat:
        out = []
    if batch:
        out.extend(lines)
    return _renumber_stable(out)


def _renumber_stable(arrivals: list[Arrival]) -> list[Arrival]:
    """Sort by time only (stable: same-instant lines keep their model order) and give
    ids in that order."""
    ids = Ids()
    return [replace(a, request_id=ids()) for a in sorted(arrivals, key=lambda a: a.at)]


BATCH_VARIANTS = {
    "batch-day": ("listener chat and a 1,000-line batch (3h window)", True, True, 0),
    "batch-chat-only": ("the batch day's listener chat, no batch", True, False, 0),
    "batch-alone": ("the batch day's 1,000-line batch, no chat", False, True, 0),
    "batch-day-fed": ("batch-day, lines fed 64 at a time", True, True, FED_LINES),
    "batch-alone-fed": ("batch-alone, lines fed 64 at a time", False, True, FED_LINES),
}
"""name: (title, chat?, batch?, lines open at once: 0 = all handed in at one instant)."""


def batch_scenario(variant: str, gpu_count: int = 1, hours: float = CHAT_HOURS) -> Scenario:
    """One of :data:`BATCH_VARIANTS` on ``gpu_count`` 24 GiB GPUs (``hours`` below
    4: a shorter morning with the batch's timing and window scaled, for tests)."""
    title, chat, batch, fed = BATCH_VARIANTS[variant]
    gpus = tuple(f"gpu{i}" for i in range(gpu_count))
    suffix = "" if hours == CHAT_HOURS else f"-{hours:g}h"
    return Scenario(
        name=f"{variant}-{gpu_count}gpu{suffix}",
        title=f"{title} on {gpu_count} x 24 GiB",
        machine=MachineSpec(gpus=tuple((g, 24 * GiB) for g in gpus)),
        models=_batch_models(gpus),
        workload=lambda rng: batch_day_workload(rng, chat=chat, batch=batch, hours=hours),
        horizon_s=hours * HOUR + HOUR,
        stored_profiles=True,
        meter_interval_s=5.0,
        seed=2024,
        batch_queued_lines=fed,
    )


def batch_window_end(scenario: Scenario) -> float:
    """The engine time at which the scenario's batch window closes (its finish-by)."""
    hours = _hours(scenario.name)
    scale = hours / CHAT_HOURS
    return (BATCH_AT + BATCH_WINDOW_S) * scale


def _hours(name: str) -> float:
    last = name.rpartition("-")[2]
    return float(last.removesuffix("h")) if last.endswith("h") else CHAT_HOURS


# -- the catalogue ---------------------------------------------------------------------------


def report_scenarios() -> list[Scenario]:
    """This module's scenarios in ``python -m sim report``."""
    return [
        radio_day_announced(1),
        radio_day_announced(2),
        radio_day_slots("np2"),
        radio_day_slots("np2", announced=True),
        *(batch_scenario(v, g) for g in (1, 2) for v in BATCH_VARIANTS),
    ]


def get(name: str) -> Scenario | None:
    """A scenario of this module by name (with an ``-Hh`` slice), or None."""
    slots = _slots_get(name)
    if slots is not None:
        return slots
    spread = name.endswith("-announced-spread")
    if name.startswith("radio-day-") and (spread or name.endswith("-announced")):
        rest = name.removeprefix("radio-day-").removesuffix("-spread").removesuffix("-announced")
        gpus, _, hours = rest.partition("-")
        return radio_day_announced(
            int(gpus.removesuffix("gpu")), float(hours.removesuffix("h") or 24), spread=spread
        )
    for variant in BATCH_VARIANTS:
        if name.startswith(variant + "-"):
            rest = name.removeprefix(variant + "-")
            gpus, _, hours = rest.partition("-")
            if not gpus.endswith("gpu") or not gpus.removesuffix("gpu").isdigit():
                continue
            return batch_scenario(
                variant, int(gpus.removesuffix("gpu")), float(hours.removesuffix("h") or CHAT_HOURS)
            )
    return None


__all__ = [
    "BATCH_MODELS",
    "BATCH_VARIANTS",
    "batch_day_workload",
    "batch_lines",
    "batch_scenario",
    "batch_window_end",
    "get",
    "newsroom_announcements",
    "radio_day_announced",
    "radio_day_slots",
    "report_scenarios",
]

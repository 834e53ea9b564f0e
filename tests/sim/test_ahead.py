"""Work yard can see coming, in the simulation: the radio day with the newsroom's
announcements and a batch handed in while chat runs (issue 12)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from sim import scenarios, scenarios_ahead
from sim.runner import SimResult, run
from sim.scenarios_ahead import (
    BATCH_MODELS,
    batch_day_workload,
    batch_scenario,
    newsroom_announcements,
    radio_day_announced,
)
from sim.targets_ahead import ahead_metrics, queueing_floor
from sim.workload import Arrival
from tests.sim.test_fair_floor import PERIODS, every_capped_order
from yard.core.decisions import AnnouncementEnded, StartBackend


def test_the_newsroom_announces_each_hours_news_and_voice_over_not_breaking_news() -> None:
    arrivals = scenarios.radio_day_workload(random.Random(2024), hours=24.0)
    announced = newsroom_announcements(arrivals)
    news = [a for a in announced if a.backend == "news-llm"]
    voice = [a for a in announced if a.backend == "tts"]
    assert len(news) == len(voice) == 24
    first = news[0]
    assert (first.at, first.not_before, first.start_by) == (0.0, 1800.0, 3000.0)
    assert (first.count, first.priority, first.app, first.label) == (3, 90.0, "newsroom", "00:30")
    assert (voice[0].not_before, voice[0].start_by) == (52 * 60.0, 58 * 60.0)
    # Every scheduled script is announced; the burst's (priority 95) are not.
    scheduled = [a for a in arrivals if a.app == "newsroom" and a.priority == 90.0]
    assert sum(a.count for a in announced) == len(scheduled) == 24 * 6
    assert any(a.priority == 95.0 for a in arrivals)


def _first_scripts_ready(result: SimResult) -> int:
    """How many hours' first news script found news-llm loaded."""
    first: dict[int, bool] = {}
    for r in result.records:
        if r.arrival.backend == "news-llm" and r.arrival.priority == 90.0:
            first.setdefault(int(r.arrival.at // 3600), r.ready_at_arrival)
    return sum(first.values())


def test_an_announced_slice_replays_byte_for_byte_and_loads_the_news_model_ahead() -> None:
    scenario = radio_day_announced(1, hours=3.0)
    first = run(scenario, "yard", seed=5, keep_log=True)
    again = run(scenario, "yard", seed=5, keep_log=True)
    assert first.log is not None and again.log is not None
    assert "".join(first.log).encode() == "".join(again.log).encode()
    assert first.announced == 6
    assert first.announcement_outcomes == {"used": 6}
    ahead = [line for line in first.log if "StartBackend" in line and "announced" in line]
    assert ahead, "news-llm was never loaded ahead of its window"
    # Without the announcements the news model is loaded only once a script waits;
    # with them, some hour's first script finds it ready (not every hour: at night
    # the music jobs, aged in the queue, outrank the announced window).
    plain = run(scenarios.radio_day(1, hours=3.0), "yard", seed=5)
    assert _first_scripts_ready(plain) == 0
    assert _first_scripts_ready(first) >= 1
    assert first.stuck == []


def test_the_baselines_see_the_same_requests_and_no_announcements() -> None:
    plain = run(scenarios.radio_day(1, hours=1.0), "localai", seed=3)
    announced = run(radio_day_announced(1, hours=1.0), "localai", seed=3)
    assert announced.announced == 0
    assert announced.log_digest == plain.log_digest
    assert [r.arrival for r in announced.records] == [r.arrival for r in plain.records]


def test_without_announcements_yard_runs_the_plain_day_unchanged() -> None:
    plain = run(scenarios.radio_day(1, hours=1.0), "yard", seed=3, keep_log=True)
    assert plain.log is not None
    assert not any("nnouncement" in line for line in plain.log)
    assert plain.announced == 0


def _lines(arrivals: list[Arrival]) -> list[Arrival]:
    return [a for a in arrivals if a.cls == "batch"]


def strip(arrivals: list[Arrival]) -> list[tuple[float, str, float]]:
    return [(a.at, a.backend, a.service_s) for a in arrivals]


def test_the_batch_variants_share_their_chat_and_their_lines() -> None:
    day = batch_day_workload(random.Random(9), hours=1.0)
    chat_only = batch_day_workload(random.Random(9), batch=False, hours=1.0)
    alone = batch_day_workload(random.Random(9), chat=False, hours=1.0)
    assert strip([a for a in day if a.cls == "normal"]) == strip(chat_only)
    assert strip(_lines(day)) == strip(alone)
    lines = _lines(day)
    # A quarter of the batch for a quarter of the window: 88 + 100 + 62 lines, handed in
    # at one instant, grouped by model in the order the models first appear in the file.
    assert len(lines) == 250
    assert len({a.at for a in lines}) == 1
    assert {a.priority for a in lines} == {20.0}
    groups = [a.backend for i, a in enumerate(lines) if i == 0 or lines[i - 1].backend != a.backend]
    assert sorted(groups) == sorted(name for name, _, _ in BATCH_MODELS)
    # The start-by is the window's end minus the model's longest service time.
    end = scenarios_ahead.BATCH_AT / 4 + scenarios_ahead.BATCH_WINDOW_S / 4
    assert all(a.start_by == end - scenarios_ahead.LINE_HIGH_S[a.backend] for a in lines)
    # Ids follow the order of submission.
    assert [a.request_id for a in day] == sorted(a.request_id for a in day)


def test_a_batch_slice_replays_byte_for_byte_and_finishes_inside_its_window() -> None:
    scenario = batch_scenario("batch-day", 1, hours=1.0)
    first = run(scenario, "yard", seed=4, keep_log=True)
    again = run(scenario, "yard", seed=4, keep_log=True)
    assert first.log is not None and again.log is not None
    assert "".join(first.log).encode() == "".join(again.log).encode()
    row = ahead_metrics(first)
    assert row["batch_lines"] == 250
    assert row["batch_in_window"] == 250
    assert row["stuck"] == 0 and row["ooms"] == 0
    # Each batch model is loaded once: summarize-llm and reason-llm do not fit
    # together on one GPU, and the lines come one model after another.
    for name, _, _ in BATCH_MODELS:
        assert row[f"loads_{name}"] == 1, name
    starts = [line for line in first.log if "StartBackend" in line]
    assert len(starts) == 3


def test_batch_scenarios_are_found_by_name() -> None:
    for variant in scenarios_ahead.BATCH_VARIANTS:
        for gpus in (1, 2):
            name = f"{variant}-{gpus}gpu"
            assert scenarios.get(name).name == name
            assert scenarios.get(name + "-1h").name == name + "-1h"
    assert scenarios.get("radio-day-2gpu-announced").announcements is not None
    assert scenarios.get("radio-day-1gpu-3h-announced").name == "radio-day-1gpu-3h-announced"
    assert scenarios.get("radio-day-1gpu").announcements is None


def test_an_announcement_ends_exactly_once_in_the_decision_log() -> None:
    result = run(radio_day_announced(1, hours=2.0), "yard", seed=2, keep_log=True)
    assert result.log is not None
    ended = [line for line in result.log if AnnouncementEnded.__name__ in line]
    assert len(ended) == result.announced == 4
    assert sum(result.announcement_outcomes.values()) == 4
    assert StartBackend.__name__ in "".join(result.log)


def test_fed_lines_follow_the_batch_services_pace() -> None:
    scenario = batch_scenario("batch-day-fed", 1, hours=1.0)
    result = run(scenario, "yard", seed=4)
    lines = [r for r in result.records if r.arrival.cls == "batch"]
    assert len(lines) == 250 and all(r.outcome == "ok" for r in lines)
    # Handed in in model order, never more than 64 open at once.
    wanted = [a.backend for a in _lines(batch_day_workload(random.Random(4), hours=1.0))]
    assert [r.arrival.backend for r in lines] == wanted
    for r in lines:
        t = r.arrival.at
        open_then = sum(o.arrival.at <= t < (o.ended_at or t) for o in lines)
        assert open_then <= scenarios_ahead.FED_LINES
    # Until a line has ended on a backend, no more than its slots go there.
    for model in scenario.models:
        on = [r for r in lines if r.arrival.backend == model.name]
        first_end = min(r.ended_at or 0.0 for r in on)
        assert sum(r.arrival.at < first_end for r in on) <= model.slots, model.name
    again = run(scenario, "yard", seed=4)
    assert again.log_digest == result.log_digest


def test_the_queueing_floor_is_first_come_first_served_on_one_instance() -> None:
    def news(at: float, service_s: float) -> Arrival:
        return Arrival(
            at=at, request_id="", backend="news-llm", priority=90.0, service_s=service_s, cls="high"
        )

    # Three 90 s scripts at 0, 1 and 2 s on one slot wait 0, 89 and 178 s.
    scripts = [news(0.0, 90.0), news(1.0, 90.0), news(2.0, 90.0)]
    assert queueing_floor(scripts, {"news-llm": 1}) == 178.0
    # With two slots only the third waits, for the first to end.
    assert queueing_floor(scripts, {"news-llm": 2}) == 88.0


def test_the_clairvoyant_bound_tries_every_order_of_a_busy_period() -> None:
    from sim.targets_ahead import clairvoyant_bound

    def news(at: float, service_s: float) -> Arrival:
        return Arrival(
            at=at, request_id="", backend="news-llm", priority=90.0, service_s=service_s, cls="high"
        )

    # A 90 s script at 0 and a 10 s one at 1: first come, first served the second
    # waits 89 s; an order that knew the times would hold the first back for the
    # short one (start at 1, the long one at 11): no order gets the longest wait
    # below 11 s.
    pair = [news(0.0, 90.0), news(1.0, 10.0)]
    assert queueing_floor(pair, {"news-llm": 1}) == 89.0
    assert clairvoyant_bound(pair, {"news-llm": 1}) == 11.0
    # Three equal scripts at once: every order makes the last wait for two.
    same = [news(0.0, 90.0), news(0.0, 90.0), news(0.0, 90.0)]
    assert clairvoyant_bound(same, {"news-llm": 1}) == 180.0
    assert clairvoyant_bound(same, {"news-llm": 2}) == 90.0


def test_a_long_busy_period_takes_the_bound_of_its_work() -> None:
    from sim.targets_ahead import EXACT_UP_TO, ROUNDING, clairvoyant_bound

    def news(at: float) -> Arrival:
        return Arrival(
            at=at, request_id="", backend="news-llm", priority=90.0, service_s=10.0, cls="high"
        )

    # More requests at once than are worked out exactly: the one started last
    # waits at least for the others' work on the one slot.
    many = [news(0.0) for _ in range(EXACT_UP_TO + 2)]
    assert clairvoyant_bound(many, {"news-llm": 1}) == 10.0 * (EXACT_UP_TO + 1) - ROUNDING
    # On two slots, for the others' work less the one still running, shared by two.
    assert clairvoyant_bound(many, {"news-llm": 2}) == 10.0 * EXACT_UP_TO / 2 - ROUNDING


def _every_order_tail(period: Sequence[Arrival], slots: int) -> list[float]:
    """``g[c]`` the slow way: every order of ``period`` list-scheduled, the least
    ``(c+1)``-th longest wait."""
    return every_capped_order(period, slots, math.inf)


@settings(max_examples=200, deadline=None)
@given(period=PERIODS, slots=st.integers(1, 3))
def test_the_pass_over_subsets_finds_what_every_order_finds(
    period: list[tuple[float, float]], slots: int
) -> None:
    from sim.targets_ahead import _period_tail, _relaxed_tail

    scripts = sorted((_script(at, service) for at, service in period), key=lambda a: a.at)
    exact = _period_tail(scripts, slots)
    # Equal to the bit: the same floating-point sums as every order's list schedule.
    assert exact == _every_order_tail(scripts, slots)
    # The bound that long periods take is never above the exact values.
    assert all(r <= e for r, e in zip(_relaxed_tail(scripts, slots), exact, strict=True))


def test_the_exact_tail_raises_the_floor_where_a_period_was_too_long_to_try() -> None:
    """Before, periods of more than seven requests took the longest wait's work
    bound (one slot) or 0 (two), and 0 for every other rank. Worked out exactly,
    seeds 5 and 9's breaking news (eight and nine scripts) and seeds 8 and 10's
    long voice-over periods raise their floors; the four judged seeds have none so
    long and keep theirs."""
    from sim.targets_ahead import (
        _busy_periods,
        _period_tail,
        _relaxed_tail,
        clairvoyant_bound,
        counted_bound,
    )

    days = {
        seed: scenarios.radio_day_workload(random.Random(seed))
        for seed in (5, 8, 9, 10, 2024, 1, 2, 3)
    }
    for seed in (5, 8, 9, 10):
        for backend, count in (("news-llm", 1), ("news-llm", 2), ("tts", 2)):
            mine = sorted(
                (a for a in days[seed] if a.cls == "high" and a.backend == backend),
                key=lambda a: a.at,
            )
            for period in _busy_periods(mine, count):
                if len(period) > 7:  # before: the work bound on one slot, else 0
                    before = _relaxed_tail(period, 1)[0] if count == 1 else 0.0
                    assert _period_tail(period, count)[0] >= before

    def floor(seed: int, gpus: int, bound: Callable[..., float] = counted_bound) -> float:
        # news-llm's instances on the shape, one slot each; tts's two slots
        return round(bound(days[seed], {"news-llm": gpus, "tts": 2}), 1)

    # (seed, GPUs): the counted floor before -> now, s.
    raised = {(5, 1): (79.3, 85.9), (5, 2): (0.0, 8.9), (9, 1): (104.5, 107.9)}
    raised[(8, 2)] = (14.1, 14.8)
    for (seed, gpus), (before, now) in raised.items():
        assert floor(seed, gpus) == now > before
    # One wait a period: seed 8 and 10's two-GPU voice-over periods (0.0 and 13.2 before).
    assert floor(8, 2, clairvoyant_bound) == 12.1
    assert floor(10, 2, clairvoyant_bound) == 16.8
    for seed, judged in {2024: 78.7, 1: 104.0, 2: 70.6, 3: 107.1}.items():
        assert floor(seed, 1) == judged


def test_no_order_beats_the_bound_on_the_radio_days() -> None:
    from sim.targets_ahead import instances_bound, instances_floor

    # First come, first served is one policy: the bound is never above its floor.
    for seed in (2024, 1, 2, 3):
        assert instances_bound(seed, 1) <= instances_floor(seed, 1)
    # On one GPU with news-llm's one slot, seeds 2024 and 1 stay above half the best
    # baseline (143 and 164 s) whatever the policy.
    assert instances_bound(2024, 1) > 143 / 2
    assert instances_bound(1, 1) > 164 / 2


def test_the_counted_bound_sits_between_the_old_bound_and_first_come_on_the_radio_days() -> None:
    from sim.targets_ahead import instances_bound, instances_counted_bound, instances_floor

    for seed in (2024, 1, 2, 3):
        counted = instances_counted_bound(seed, 1)
        assert instances_bound(seed, 1) <= counted <= instances_floor(seed, 1)
    # Seed 3: first come, first served's p95 (107 s) is the floor itself; the old
    # bound said 79 s.
    assert instances_bound(3, 1) < 79.0
    assert instances_counted_bound(3, 1) == instances_floor(3, 1)


def test_a_schedule_that_knew_the_day_reaches_the_counted_bound_on_the_radio_days() -> None:
    """The floor is no looser than the relaxation it bounds: on each seed, every
    busy period has an order with no more waits over the floor than the floor
    allots it that ends before the next period begins, so running those orders
    one after another is a schedule of the day (news-llm and tts always loaded)
    whose p95 is the floor, and which meets every start-by."""
    from sim.metrics import percentile
    from sim.targets_ahead import _at, _busy_periods, _list_waits, counted_bound

    for seed, news in itertools.product((2024, 1, 2, 3), (1, 2)):
        slots = {"news-llm": news, "tts": 2}  # one GPU, two (two instances)
        arrivals = scenarios.radio_day_workload(random.Random(seed))
        floor = counted_bound(arrivals, slots)
        waits: list[float] = []
        for backend, count in slots.items():
            mine = sorted(
                (a for a in arrivals if a.cls == "high" and a.backend == backend), key=_at
            )
            periods = _busy_periods(mine, count)
            for i, period in enumerate(periods):
                ends = periods[i + 1][0].at if i + 1 < len(periods) else math.inf
                order = _fewest_over_then_soonest(period, count, floor)
                assert _end(order, count) <= ends
                waits += _list_waits(order, count)
                # Every start-by is met too (all the high class's are feasible:
                # four minutes or more after arrival, a load under one), so
                # counting the deadlines every acceptable policy meets raises
                # nothing.
                for a, wait in zip(order, _list_waits(order, count), strict=True):
                    assert a.start_by is not None and a.at + wait <= a.start_by
        waits += [0.0] * (sum(a.cls == "high" for a in arrivals) - len(waits))
        assert percentile(waits, 0.95) == floor


def _fewest_over_then_soonest(
    period: Sequence[Arrival], slots: int, floor: float
) -> Sequence[Arrival]:
    """The order of ``period`` with the fewest waits over ``floor``, ending soonest."""
    from sim.targets_ahead import _list_waits

    def key(order: Sequence[Arrival]) -> tuple[int, float]:
        return sum(w > floor for w in _list_waits(order, slots)), _end(order, slots)

    return min(itertools.permutations(period), key=key)


def _end(order: Sequence[Arrival], slots: int) -> float:
    """When the last of ``order``, list-scheduled on ``slots`` slots, ends."""
    free = [0.0] * slots
    for a in order:
        k = min(range(slots), key=lambda k: free[k])
        free[k] = max(a.at, free[k]) + a.service_s
    return max(free)


def test_no_policy_in_the_simulation_goes_below_the_counted_bound() -> None:
    """The floor against real runs, loads and all: every policy on the first six
    hours of the one-GPU radio day (night music evicting news-llm, five news
    windows) and yard with the announcements, waits counted to the first dispatch
    and a request never dispatched as waiting for ever. The whole day on seeds
    2024, 1, 2 and 3 is in docs/simulation.md (too slow for here)."""
    from sim.metrics import percentile
    from sim.runner import POLICIES
    from sim.targets_ahead import counted_bound

    days = [(scenarios.radio_day(1, 6.0), p) for p in POLICIES]
    days.append((radio_day_announced(1, 6.0), "yard"))
    for (scenario, policy), seed in itertools.product(days, (2024, 3)):
        result = run(scenario, policy, seed)
        slots = {m.name: m.slots for m in scenario.models if m.name in ("news-llm", "tts")}
        assert slots == {"news-llm": 1, "tts": 2}
        floor = counted_bound([r.arrival for r in result.records], slots)
        waits = [
            r.dispatches[0] - r.arrival.at if r.dispatches else math.inf
            for r in result.records
            if r.arrival.cls == "high"
        ]
        assert percentile(waits, 0.95) >= floor > 0.0, (policy, seed)


def test_blind_orders_against_the_clairvoyant_bound() -> None:
    from sim.targets_ahead import clairvoyant_bound, order_waits

    # Three scripts on one slot: 100 s at 0, 10 s at 1, 90 s at 2. First come:
    # waits 0, 99, 108; last come: 0, 98 (the 90 s one), 189; shortest first: as
    # first come. The bound tries every order, even one that leaves the slot idle
    # for a second to start the 10 s script first: 0, 9, 101.
    scripts = [
        Arrival(
            at=t, request_id=f"s{t:.0f}", backend="news-llm", priority=90.0, service_s=s, cls="high"
        )
        for t, s in ((0.0, 100.0), (1.0, 10.0), (2.0, 90.0))
    ]
    slots = {"news-llm": 1}
    assert order_waits(scripts, slots, "first come") == 108.0
    assert order_waits(scripts, slots, "last come") == 189.0
    # Breaking news (95) before the hour's scripts (90): the 10 s one at 1 is a
    # breaking script and goes before the 90 s one at 2, as first come does here.
    urgent = [scripts[0], dataclasses.replace(scripts[1], priority=95.0), scripts[2]]
    assert order_waits(urgent, slots, "priority, then first come") == 108.0
    late = [scripts[0], scripts[1], dataclasses.replace(scripts[2], priority=95.0)]
    # The 90 s one at 2 now goes first (starts at 100, waits 98), the 10 s one at 190.
    assert order_waits(late, slots, "priority, then first come") == 189.0
    assert order_waits(scripts, slots, "shortest first (knows lengths)") == 108.0
    assert clairvoyant_bound(scripts, slots) == 101.0


def _script(at: float, service_s: float) -> Arrival:
    return Arrival(
        at=at, request_id="", backend="news-llm", priority=90.0, service_s=service_s, cls="high"
    )


def test_the_counted_bound_counts_a_periods_second_long_wait() -> None:
    from sim.targets_ahead import clairvoyant_bound, counted_bound

    # Twenty scripts, so the p95 (nearest rank) is the 2nd longest wait: three 90 s
    # scripts at once, then seventeen alone. In every order the three wait 0, 90
    # and 180 s. One wait a period counted says only that some wait is 180 s, so
    # the 2nd longest could be 0; counting every wait, two of the burst wait 90 s
    # or more, and first come, first served reaches that.
    day = [_script(0.0, 90.0) for _ in range(3)]
    day += [_script(1000.0 * (i + 1), 10.0) for i in range(17)]
    assert clairvoyant_bound(day, {"news-llm": 1}) == 0.0
    assert counted_bound(day, {"news-llm": 1}) == 90.0
    assert queueing_floor(day, {"news-llm": 1}) == 90.0
    # Two such bursts: two periods with a 180 s wait each; both bounds say 180 s.
    two = day[:3] + [_script(50_000.0, 90.0) for _ in range(3)] + day[3:17]
    assert clairvoyant_bound(two, {"news-llm": 1}) == 180.0
    assert counted_bound(two, {"news-llm": 1}) == 180.0


def test_the_counted_bound_trades_one_long_wait_for_two_short_ones() -> None:
    from sim.targets_ahead import clairvoyant_bound, counted_bound

    # A 100 s script at 0, 10 s ones at 1 and 2, and seventeen alone (the p95 is
    # the 2nd longest wait). First come: 0, 99, 108. Holding the long one back
    # for the short ones (the slot idle a second): the one at 1 waits 0, the one
    # at 2 starts at 11 (9 s), the long one at 21 (21 s). No order gets the 2nd
    # longest below 9 s; one wait a period counted gives only the longest, 21 s,
    # which is not the p95 here.
    day = [_script(0.0, 100.0), _script(1.0, 10.0), _script(2.0, 10.0)]
    day += [_script(1000.0 * (i + 1), 10.0) for i in range(17)]
    assert queueing_floor(day, {"news-llm": 1}) == 99.0
    assert counted_bound(day, {"news-llm": 1}) == 9.0
    assert clairvoyant_bound(day, {"news-llm": 1}) == 0.0
    assert _best_p95(day[:3], 17, 1) == 9.0


def _best_p95(core: list[Arrival], alone: int, slots: int) -> float:
    """The smallest p95 any schedule reaches on ``core`` plus ``alone`` requests
    that come one at a time long after it (each waits 0): every order of the
    core, each request started as soon as it has come and a slot is free (no
    schedule does better than the list schedule of its own order)."""
    from sim.metrics import percentile
    from sim.targets_ahead import _list_waits

    return min(
        percentile(_list_waits(order, slots) + [0.0] * alone, 0.95)
        for order in itertools.permutations(core)
    )


@settings(max_examples=150, deadline=None)
@given(
    core=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 150)), min_size=1, max_size=6),
    alone=st.integers(0, 40),
    slots=st.integers(1, 2),
)
def test_no_schedule_of_a_tiny_day_goes_below_the_counted_bound(
    core: list[tuple[int, int]], alone: int, slots: int
) -> None:
    from sim.targets_ahead import _busy_periods, clairvoyant_bound, counted_bound

    scripts = [_script(float(at), float(service)) for at, service in core]
    lonely = [_script(1e6 + 1000.0 * i, 1.0) for i in range(alone)]
    bound = counted_bound(scripts + lonely, {"news-llm": slots})
    best = _best_p95(scripts, alone, slots)
    assert clairvoyant_bound(scripts + lonely, {"news-llm": slots}) <= bound <= best
    # With the core one busy period, the bound is that optimum itself.
    if len(_busy_periods(sorted(scripts, key=lambda a: a.at), slots)) == 1:
        assert bound == best

"""Time windows and announcements: held requests, loads done ahead, backends kept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.harness import GIB, Harness, gpu, host
from yard.core import (
    AnnouncementEnded,
    AnnouncementMade,
    AnnouncementWithdrawn,
    BackendSpec,
    Dispatch,
    Event,
    Flag,
    ProfileMeasured,
    RequestArrived,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
)


def machine(idle_ttl_s: float | None = None, *, reference: bool = False, **cfg: float) -> Harness:
    """One 24 GiB GPU; chat (16 GiB, loads in 20 s) and big (16 GiB, 30 s): one at a time.
    ``reference``: its scheduler plans every load afresh on every event."""
    backends = [
        BackendSpec(name="chat", gpus=("gpu0",), idle_ttl_s=idle_ttl_s),
        BackendSpec(name="big", gpus=("gpu0",)),
    ]
    devices = (gpu("gpu0", 24), host(64))
    config = SchedulerConfig(default_service_s=10, **cfg)  # type: ignore[arg-type]
    profiles = {"chat": (16.0, 1.0, 20.0), "big": (16.0, 1.0, 30.0)}
    h = Harness(backends, devices=devices, config=config)
    if reference:
        h.s = Scheduler(devices, backends, config, replan_everything=True)
    for name, (g, m, load) in profiles.items():
        h.feed(
            ProfileMeasured(
                backend=name,
                gpu_bytes=int(g * GIB),
                host_bytes=int(m * GIB),
                load_s=load,
                source="stored",
            )
        )
    return h


def held(
    rid: str, backend: str, not_before: float, priority: float = 50, **kw: object
) -> RequestArrived:
    return RequestArrived(
        request_id=rid,
        backend=backend,
        priority=priority,
        not_before=not_before,
        **kw,  # type: ignore[arg-type]
    )


def announced(
    aid: str,
    backend: str,
    opens: float,
    closes: float,
    count: int = 3,
    priority: float = 90,
    app: str = "radio",
) -> AnnouncementMade:
    return AnnouncementMade(
        announcement_id=aid,
        app=app,
        backend=backend,
        not_before=opens,
        start_by=closes,
        count=count,
        priority=priority,
        label=f"t={opens:g}",
    )


def test_a_held_request_is_dispatched_when_its_window_opens_not_before() -> None:
    h = machine()
    h.load("chat", "r0", at=0)
    h.finish("r0", at=1)
    h.play([(10.0, held("w", "chat", 100.0))], {"w": 5.0}, until=200)
    assert h.dispatch_times() == [(0.0, "r0"), (100.0, "w")]


def test_a_held_request_loads_its_backend_ahead_so_it_starts_at_once() -> None:
    h = machine()
    h.play([(0.0, held("w", "chat", 100.0))], {"w": 5.0}, until=200)
    # window 100, load 20 s, margin 2 s: the load starts at 78, ready at 98
    starts = [(t, d) for t, d in h.log if isinstance(d, StartBackend)]
    assert [(t, d.backend) for t, d in starts] == [(78.0, "chat")]
    assert "1 held request from" in starts[0][1].reason
    assert h.dispatch_times() == [(100.0, "w")]


def test_a_held_request_waits_with_its_reason_and_is_listed() -> None:
    h = machine()
    h.feed(held("w", "chat", 100.0, window_label="13:50:00Z (X-Yard-Not-Before)"), at=5)
    view = h.s.explain("w", 5)
    assert view is not None
    assert view.reason == "held until 13:50:00Z (X-Yard-Not-Before)"
    assert view.estimated_start == 100.0
    assert [q.request_id for q in h.s.snapshot(5).queue] == ["w"]
    h.feed(held("x", "chat", 100.0), at=6)
    x = h.s.explain("x", 10)
    assert x is not None and x.reason == "held for 90.0 s more (not before)"


def test_a_cancelled_held_request_leaves_and_never_runs() -> None:
    h = machine()
    h.feed(held("w", "chat", 100.0), at=0)
    h.cancel("w", at=50)
    h.play([], {}, until=300)
    assert h.dispatched() == []
    assert h.started() == []
    assert h.s.explain("w", 300) is None


def test_held_requests_count_against_the_queue_limit() -> None:
    h = machine(queue_limit=1)
    h.feed(held("w", "chat", 100.0), at=0)
    h.arrive("r", "chat", at=1)
    assert h.rejected()["r"].code == "queue_full"


def test_a_start_by_is_checked_and_timed_when_the_window_opens() -> None:
    h = machine(urgency_window_s=0)
    # start-by 10 s after the window: infeasible at arrival (a 20 s load), not
    # when chat is loaded ahead for the window
    h.play([(0.0, held("w", "chat", 100.0, start_by=110.0))], {"w": 5.0}, until=200)
    assert h.rejected() == {}
    assert h.dispatch_times() == [(100.0, "w")]


def test_aging_counts_from_the_window_opening() -> None:
    h = machine()
    h.load("chat", "r0", at=0)  # busy until r0 finishes
    h.feed(held("early", "chat", 100.0, priority=50), at=1)
    h.arrive("late", "chat", priority=50, at=90)
    h.finish("r0", at=101)
    # "early" arrived first but counts from 100: "late" waited longer
    assert h.dispatched() == ["r0", "late"]


def test_an_announcement_loads_its_backend_ahead_with_the_reason() -> None:
    h = machine()
    h.feed(announced("news", "chat", 300.0, 900.0), at=0)
    assert h.s.next_wakeup() == 278.0
    out = h.tick(278)
    starts = [d for d in out if isinstance(d, StartBackend)]
    assert [d.backend for d in starts] == ["chat"]
    assert "loading chat now: 3 announced requests from t=300 (news)" in starts[0].reason
    h.ready("chat", at=298)
    out = h.arrive("n1", "chat", priority=90, at=300, app="radio")
    assert [d.request_id for d in out if isinstance(d, Dispatch)] == ["n1"]


def test_a_backend_with_announced_work_within_its_reload_time_is_not_evicted() -> None:
    h = machine(idle_ttl_s=90)  # idle from 1: its timer comes at 91, inside the window
    h.load("chat", "r0", at=0)
    h.finish("r0", at=1)
    h.feed(announced("news", "chat", 100.0, 400.0, priority=90), at=2)
    h.tick(78)  # within chat's reload time (20 s + 2 s) of the window
    out = h.arrive("b1", "big", priority=50, at=80)
    assert [d for d in out if isinstance(d, StopBackend)] == []
    view = h.s.explain("b1", 80)
    assert view is not None
    assert "keeping chat: 3 announced requests from t=100 is within its 20.0 s reload time" in (
        view.reason
    )
    # nor stopped when idle past its idle_ttl_s, and it says why
    h.tick(200)
    assert h.stops() == []
    kept = [f.reason for _, f in h.log if isinstance(f, Flag) and f.backend == "chat"]
    assert kept == [
        "keeping chat: 3 announced requests from t=100 is within its 20.0 s reload time"
    ]


def test_without_the_announcement_the_same_backend_is_evicted() -> None:
    h = machine(idle_ttl_s=500)
    h.load("chat", "r0", at=0)
    h.finish("r0", at=1)
    out = h.arrive("b1", "big", priority=50, at=80)
    assert [d.backend for d in out if isinstance(d, StopBackend)] == ["chat"]


def test_work_that_ranks_higher_still_evicts_a_kept_backend() -> None:
    h = machine()
    h.load("chat", "r0", at=0)
    h.finish("r0", at=1)
    h.feed(announced("news", "chat", 100.0, 400.0, priority=10), at=2)
    h.tick(78)
    out = h.arrive("b1", "big", priority=90, at=80)
    assert [d.backend for d in out if isinstance(d, StopBackend)] == ["chat"]


def test_an_expired_announcement_releases_the_hold() -> None:
    h = machine()
    h.load("chat", "r0", at=0)
    h.finish("r0", at=1)
    h.feed(announced("news", "chat", 100.0, 150.0, priority=90), at=2)
    h.arrive("b1", "big", priority=50, at=80)
    assert h.stops() == []
    out = h.tick(150)
    ended = [d for d in out if isinstance(d, AnnouncementEnded)]
    assert [(d.announcement_id, d.outcome, d.used) for d in ended] == [("news", "expired", 0)]
    assert [d.backend for d in out if isinstance(d, StopBackend)] == ["chat"]


def test_requests_inside_the_window_use_up_the_announcement() -> None:
    h = machine()
    h.load("chat", "r0", at=0)
    h.feed(announced("news", "chat", 100.0, 400.0, count=2), at=1)
    h.arrive("before", "chat", at=50, app="radio")  # before the window: not counted
    h.arrive("other", "chat", at=101, app="someone-else")  # another app: not counted
    h.arrive("n1", "chat", at=102, app="radio")
    out = h.arrive("n2", "chat", at=103, app="radio")
    ended = [d for d in out if isinstance(d, AnnouncementEnded)]
    assert [(d.outcome, d.used, d.app) for d in ended] == [("used", 2, "radio")]
    assert h.s.next_wakeup() is None or h.s.next_wakeup() != 400.0


def test_a_held_request_inside_the_window_uses_the_announcement() -> None:
    h = machine()
    h.feed(announced("news", "chat", 100.0, 400.0, count=1), at=0)
    out = h.feed(held("n1", "chat", 120.0, app="radio"), at=10)
    assert [d.outcome for d in out if isinstance(d, AnnouncementEnded)] == ["used"]


def test_a_withdrawn_announcement_ends_once_and_frees_the_backend() -> None:
    h = machine()
    h.feed(announced("news", "chat", 100.0, 400.0), at=0)
    out = h.feed(AnnouncementWithdrawn(announcement_id="news"), at=10)
    assert [d.outcome for d in out if isinstance(d, AnnouncementEnded)] == ["withdrawn"]
    h.feed(AnnouncementWithdrawn(announcement_id="news"), at=11)
    h.play([], {}, until=500)
    assert h.started() == []
    assert len(h.decisions(AnnouncementEnded)) == 1


def test_an_announcement_whose_window_passed_expires_at_once() -> None:
    h = machine()
    out = h.feed(announced("old", "chat", 10.0, 20.0), at=30)
    assert [d.outcome for d in out if isinstance(d, AnnouncementEnded)] == ["expired"]


def test_a_backend_that_fails_to_start_ahead_is_not_started_again_and_again() -> None:
    h = machine()
    h.feed(announced("news", "chat", 100.0, 400.0), at=0)
    h.tick(78)
    h.start_failed("chat", at=79)
    h.tick(399)
    assert h.started() == ["chat"]
    # requests still load it as usual
    h.arrive("n1", "chat", at=399, app="radio")
    assert h.started() == ["chat", "chat"]


def test_nothing_without_windows_changes_the_decisions() -> None:
    """Same events with and without an announcement for an unused backend's far future."""
    a, b = machine(), machine()
    b.feed(announced("far", "big", 10_000.0, 10_100.0), at=0)
    for h in (a, b):
        h.load("chat", "r0", at=1)
        h.arrive("r1", "chat", at=2)
        h.finish("r0", at=5)
        h.finish("r1", at=9)
    assert [(t, d) for t, d in a.log] == [(t, d) for t, d in b.log[len(b.log) - len(a.log) :]]


# -- the invariant --------------------------------------------------------------


arrival = st.tuples(
    st.integers(0, 200),  # arrives at
    st.sampled_from(["chat", "big"]),
    st.integers(0, 100),  # priority
    st.one_of(st.none(), st.integers(0, 300)),  # not_before
    st.integers(1, 40),  # service
    st.sampled_from(["radio", "web"]),
)
announcement = st.tuples(
    st.integers(0, 200),  # made at
    st.sampled_from(["chat", "big"]),
    st.integers(0, 300),  # opens
    st.integers(1, 200),  # length
    st.integers(1, 4),
    st.integers(0, 100),
    st.booleans(),  # withdrawn 30 s later
)


@settings(max_examples=150, deadline=None)
@given(st.lists(arrival, max_size=25), st.lists(announcement, max_size=4))
def test_nothing_is_dispatched_before_its_not_before(
    arrivals: list[tuple[int, str, int, int | None, int, str]],
    announcements: list[tuple[int, str, int, int, int, int, bool]],
) -> None:
    h = machine(idle_ttl_s=30)
    ref = machine(idle_ttl_s=30, reference=True)
    events: list[tuple[float, Event]] = []
    not_before: dict[str, float] = {}
    service: dict[str, float] = {}
    for i, (t, backend, prio, nb, svc, app) in enumerate(arrivals):
        rid = f"r{i}"
        service[rid] = float(svc)
        if nb is not None:
            not_before[rid] = float(nb)
        event = RequestArrived(
            request_id=rid,
            backend=backend,
            priority=prio,
            app=app,
            not_before=None if nb is None else float(nb),
        )
        events.append((float(t), event))
    for i, (t, backend, opens, length, count, prio, withdrawn) in enumerate(announcements):
        aid = f"a{i}"
        made = announced(aid, backend, float(opens), float(opens + length), count, prio)
        events.append((float(t), made))
        if withdrawn:
            events.append((float(t + 30), AnnouncementWithdrawn(announcement_id=aid)))
    events.sort(key=lambda e: e[0])
    h.play(events, service, until=5_000)
    # Incremental planning decides exactly as planning everything afresh would.
    ref.play(events, service, until=5_000)
    assert ref.log == h.log
    for at, d in h.log:
        if isinstance(d, Dispatch):
            assert at >= not_before.get(d.request_id, 0.0), (d.request_id, at)
    # every request ends exactly once: dispatched or refused
    ended = [d.request_id for d in h.decisions(Dispatch)] + list(h.rejected())
    assert sorted(ended) == sorted(service)
    # every announcement ends exactly once
    ends = [d.announcement_id for d in h.decisions(AnnouncementEnded)]
    assert sorted(ends) == sorted(f"a{i}" for i in range(len(announcements)))


# -- the window's urgency ---------------------------------------------------------


def music_night(h: Harness) -> None:
    """big plays 300 s music jobs (priority 10) back to back, two more queued at
    850 and 860; chat's announced window (priority 90) opens at 1000; its one
    request comes then. By 1000 the queued music has aged past the window's
    stand-in (rank 10 - 850 against 90 - 1000), not past its deadline boost."""
    h.feed(announced("news", "chat", 1000.0, 1600.0, count=1), at=0)
    music = [(0.0, "m0"), (250.0, "m1"), (550.0, "m2"), (850.0, "m3"), (860.0, "m4")]
    arrivals = [
        (t, RequestArrived(request_id=rid, backend="big", priority=10, app="music"))
        for t, rid in music
    ]
    arrivals.append(
        (1000.0, RequestArrived(request_id="n1", backend="chat", priority=90, app="radio"))
    )
    service = {rid: 300.0 for _, rid in music} | {"n1": 60.0}
    h.play(arrivals, service, until=1000)


def test_an_announced_window_drains_busy_work_in_time_to_be_ready_when_it_opens() -> None:
    h = machine()
    music_night(h)
    # Its load must start by 1000 - 20 s, after big's longest job (300 s) drains: urgent
    # from 1000 - 20 - 300 - 2 (lead margin) = 678, while m2 runs (630 to 930). big takes
    # no new job (m3 waits), is held once m2 ends, stops when chat's load is due
    # (1000 - 20 - 2 = 978), and chat is ready at 999.
    assert h.dispatch_times()[-1] == (1000.0, "n1")  # before: m3 at 930, chat not loaded
    assert h.dispatched() == ["m0", "m1", "m2", "n1"]
    starts = [(t, d) for t, d in h.log if isinstance(d, StartBackend)]
    assert [(t, d.backend) for t, d in starts] == [(0.0, "big"), (979.0, "chat")]
    assert starts[1][1].reason.startswith(
        "starting chat: loading chat now: 1 announced request from t=1000 (news); urgent: its "
        "20.0 s load must start in time for t=1000, so what it evicts takes no new work that "
        "would run past it"
    )
    stops = [(t, d) for t, d in h.log if isinstance(d, StopBackend)]
    assert [(t, d.backend) for t, d in stops] == [(978.0, "big")]
    assert "making room for chat" in stops[0][1].reason
    view = h.s.explain("m3", 1000)
    assert view is not None and view.reason.startswith("waiting")


def test_an_urgent_window_shows_when_it_began_to_count_for_its_load() -> None:
    h = machine()
    h.feed(announced("news", "chat", 1000.0, 1600.0, count=1), at=0)
    music = [(0.0, "m0"), (250.0, "m1"), (550.0, "m2")]
    arrivals = [
        (t, RequestArrived(request_id=rid, backend="big", priority=10, app="music"))
        for t, rid in music
    ]
    h.play(arrivals, {rid: 300.0 for _, rid in music}, until=700)
    # Urgent since 678 (see above): the view gives that time, not minus
    # infinity (the dashboard's timeline draws it and sends it as JSON).
    [window] = h.s.snapshot(700.0).windows
    assert window.loads_from == 1000.0 - 20.0 - 300.0 - 2.0


def music_before_news(
    music: list[tuple[float, str]], service: dict[str, float], *, reference: bool = False
) -> Harness:
    """big plays the ``music`` jobs (priority 10, ``service`` seconds each) from
    0; chat's announced window (priority 90) opens at 1000 and its one request
    n1 (60 s) comes then. With big's longest job 300 s, the window is urgent from
    1000 - 20 - 300 - 2 = 678 and its load due at 978; played until 1300."""
    h = machine(reference=reference)
    h.feed(announced("news", "chat", 1000.0, 1600.0, count=1), at=0)
    arrivals = [
        (t, RequestArrived(request_id=rid, backend="big", priority=10, app="music"))
        for t, rid in music
    ]
    arrivals.append(
        (1000.0, RequestArrived(request_id="n1", backend="chat", priority=90, app="radio"))
    )
    h.play(arrivals, service | {"n1": 60.0}, until=1300)
    return h


def test_work_that_would_run_into_a_due_window_load_waits_for_the_window() -> None:
    """m3 (queued at 600) would run from 930 to 1230, past chat's load (due at
    978). Before, it went first: it ranked above the window's stand-in, which
    counted from the window's opening (10 - 600 against 90 + 200 - 1000), and
    chat loaded at 1231, n1 waiting 251 s. The stand-in now counts from its
    urgency (90 + 200 - 678): m3 waits for the window, chat is ready when n1
    comes, and big loads again after n1 for m3."""
    music = [(0.0, "m0"), (250.0, "m1"), (550.0, "m2"), (600.0, "m3")]
    h = music_before_news(music, {rid: 300.0 for _, rid in music})
    assert h.dispatch_times() == [
        (30.0, "m0"),
        (330.0, "m1"),
        (630.0, "m2"),
        (1000.0, "n1"),
        (1091.0, "m3"),
    ]
    starts = [(t, d.backend) for t, d in h.log if isinstance(d, StartBackend)]
    assert starts == [(0.0, "big"), (979.0, "chat"), (1061.0, "big")]


def test_music_that_waited_past_the_boost_when_the_window_became_urgent_still_goes_first() -> None:
    """The wait bound: the window's stand-in counts one deadline boost from its
    urgency (678), no more. m3, queued at 390, ranks above it (10 - 390 against
    90 + 200 - 678) and goes first at 930 though it runs into the load, as it
    would before an urgent request that came at 678."""
    music = [(0.0, "m0"), (250.0, "m1"), (380.0, "m2"), (390.0, "m3")]
    h = music_before_news(music, {rid: 300.0 for _, rid in music})
    assert h.dispatch_times() == [
        (30.0, "m0"),
        (330.0, "m1"),
        (630.0, "m2"),
        (930.0, "m3"),
        (1251.0, "n1"),
    ]
    assert h.started() == ["big", "chat"]


def test_work_expected_to_end_before_the_load_is_due_still_goes() -> None:
    """big's jobs run 240 s on average now (300, then 100), 300 s at most: the
    window is urgent from 678 all the same. m2, at 700, is expected to end at
    940, before the load is due (978): it goes. m3, at 710, would not (m2 ends
    at 800, and big's mean is 198 s by then): it waits for the window."""
    music = [(0.0, "m0"), (250.0, "m1"), (700.0, "m2"), (710.0, "m3")]
    h = music_before_news(music, {"m0": 300.0, "m1": 100.0, "m2": 100.0, "m3": 100.0})
    assert h.dispatch_times() == [
        (30.0, "m0"),
        (330.0, "m1"),
        (700.0, "m2"),
        (1000.0, "n1"),
        (1091.0, "m3"),
    ]
    [m2] = [d for d in h.decisions(Dispatch) if d.request_id == "m2"]
    assert m2.reason.endswith("; expected to end before chat's load is due (in 278 s)")
    starts = [(t, d.backend) for t, d in h.log if isinstance(d, StartBackend)]
    assert starts == [(0.0, "big"), (979.0, "chat"), (1061.0, "big")]


def test_a_request_for_the_window_backend_loads_it_at_once() -> None:
    """A request for chat (priority 0, at 800) ranks below the urgent window's
    stand-in, which then stands for chat in planning. Its load is for that
    request too: it starts at once, not when the window's load is due (before:
    held until 978, the request waiting 199 s)."""
    h = machine()
    h.feed(announced("news", "chat", 1000.0, 1600.0, count=1), at=0)
    arrivals = [
        (0.0, RequestArrived(request_id="m0", backend="big", priority=10, app="music")),
        (800.0, RequestArrived(request_id="c1", backend="chat", priority=0, app="chat")),
    ]
    h.play(arrivals, {"m0": 300.0, "c1": 10.0}, until=900)
    assert h.dispatch_times() == [(30.0, "m0"), (821.0, "c1")]
    stops = [(t, d.backend) for t, d in h.log if isinstance(d, StopBackend)]
    assert stops == [(800.0, "big")]


def test_a_window_load_due_and_planned_afresh_decide_the_same() -> None:
    for music, service in (
        ([(0.0, "m0"), (250.0, "m1"), (550.0, "m2"), (600.0, "m3")], 300.0),
        ([(0.0, "m0"), (250.0, "m1"), (700.0, "m2"), (710.0, "m3")], 100.0),
    ):
        times = {rid: service for _, rid in music} | {"m0": 300.0}
        h = music_before_news(music, times)
        ref = music_before_news(music, times, reference=True)
        assert ref.log == h.log

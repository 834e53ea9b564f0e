"""Room lent to an app ahead of its share, given back (yard.core.lending): a
low-weight app's load may stop an idle backend that a higher-weight app asked
for lately, and that backend is loaded back once the borrower has nothing to
do, so the other app's next request finds it ready. Stale demand (older than
GIVE_BACK_WITHIN_S) gets nothing back; without weights nothing is lent."""

from __future__ import annotations

from tests.core.harness import GIB, Harness, gpu, host
from yard.core import (
    AdminLoad,
    AdminUnload,
    BackendSpec,
    ProfileMeasured,
    RequestArrived,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
)
from yard.core.lending import GIVE_BACK_WITHIN_S

# news (14 GiB, 40 s to load) and image (12 GiB, 25 s) do not fit together on 24 GiB
PROFILES = {"news": (14.0, 40.0), "image": (12.0, 25.0)}
SERVICE = {"n1": 30.0, "n2": 30.0, "r1": 6.0, "r2": 6.0}


def harness(
    weights: dict[str, float] | None, profiles: dict[str, tuple[float, float]] = PROFILES
) -> Harness:
    """One 24 GiB GPU, a backend on it for each of ``profiles`` (name: GiB,
    load seconds), and the app ``weights``."""
    backends = [BackendSpec(name=name, gpus=("gpu0",)) for name in profiles]
    devices = (gpu(gib=24), host())
    h = Harness(backends, devices=devices)
    h.s = Scheduler(devices, backends, SchedulerConfig(), weights=weights)
    for name, (gib, load_s) in profiles.items():
        h.feed(
            ProfileMeasured(
                backend=name,
                gpu_bytes=int(gib * GIB),
                host_bytes=GIB,
                load_s=load_s,
                source="stored",
            )
        )
    return h


def asked(rid: str, backend: str, priority: float, app: str) -> RequestArrived:
    return RequestArrived(request_id=rid, backend=backend, priority=priority, app=app)


def day(h: Harness, renders_at: float, news_again_at: float) -> None:
    """The newsroom asks news at 0; two renders come at ``renders_at``; the
    newsroom asks again at ``news_again_at``."""
    arrivals = [
        (0.0, asked("n1", "news", 90, "newsroom")),
        (renders_at, asked("r1", "image", 10, "render")),
        (renders_at, asked("r2", "image", 10, "render")),
        (news_again_at, asked("n2", "news", 90, "newsroom")),
    ]
    h.play(arrivals, SERVICE, until=news_again_at + 200.0)


def starts(h: Harness) -> list[tuple[float, str, str]]:
    return [(t, d.backend, d.reason) for t, d in h.log if isinstance(d, StartBackend)]


def test_a_low_weight_apps_load_gives_the_room_back_once_its_work_is_done() -> None:
    h = harness({"render": 0.25})
    day(h, renders_at=600.0, news_again_at=1200.0)
    times = dict((rid, t) for t, rid in h.dispatch_times())
    # news stopped for the renders (nothing waits for it), the renders served ...
    stop = next(d for t, d in h.log if isinstance(d, StopBackend) and t == 600.0)
    assert stop.backend == "news"
    assert "render is ahead of its share: news's room is lent" in stop.reason
    assert times["r1"] == 626.0 and times["r2"] == 632.0  # 1 s stop, 25 s load
    # ... and once image has nothing to do, news is loaded back, image stopped
    back = starts(h)[-1]
    assert back[:2] == (639.0, "news")  # r2 ends at 638, image stops in 1 s
    assert "giving news its room back" in back[2]
    assert "for render, an app ahead of its share" in back[2]
    assert h.stops() == ["news", "image"]
    # so the newsroom's next request finds it ready
    assert times["n2"] == 1200.0


def test_without_weights_nothing_is_lent_and_the_next_request_pays_the_load() -> None:
    h = harness(None)
    day(h, renders_at=600.0, news_again_at=1200.0)
    times = dict((rid, t) for t, rid in h.dispatch_times())
    assert [b for _, b, _ in starts(h)] == ["news", "image", "news"]
    assert times["n2"] == 1200.0 + 1.0 + 40.0  # image stops, news loads


def test_stale_demand_gets_no_room_back() -> None:
    h = harness({"render": 0.25})
    late = GIVE_BACK_WITHIN_S + 100.0  # news last asked for at 0
    day(h, renders_at=late, news_again_at=late + 600.0)
    times = dict((rid, t) for t, rid in h.dispatch_times())
    stop = next(d for t, d in h.log if isinstance(d, StopBackend) and t == late)
    assert stop.backend == "news" and "lent" not in stop.reason
    assert [b for _, b, _ in starts(h)] == ["news", "image", "news"]
    assert times["n2"] == late + 600.0 + 1.0 + 40.0


def test_a_request_waiting_for_a_load_goes_before_the_room_given_back() -> None:
    # voice (13 GiB) does not fit beside image: its request at 630 waits for r2
    # to end (638) and image to stop (639). Image has nothing to do then, but
    # voice's request waits for a load: voice loads first, news after it.
    h = harness({"render": 0.25}, {**PROFILES, "voice": (13.0, 10.0)})
    arrivals = [
        (0.0, asked("n1", "news", 90, "newsroom")),
        (600.0, asked("r1", "image", 10, "render")),
        (600.0, asked("r2", "image", 10, "render")),
        (630.0, asked("v1", "voice", 50, "studio")),
    ]
    h.play(arrivals, {**SERVICE, "v1": 20.0}, until=1000.0)
    times = dict((rid, t) for t, rid in h.dispatch_times())
    assert [(t, b) for t, b, _ in starts(h)] == [
        (0.0, "news"),
        (601.0, "image"),
        (639.0, "voice"),
        (670.0, "news"),  # v1 ends at 669, voice stops in 1 s
    ]
    assert times["v1"] == 649.0
    assert "giving news its room back" in starts(h)[-1][2]


def test_a_give_back_that_fails_to_start_is_not_tried_again() -> None:
    h = harness({"render": 0.25})
    arrivals = [
        (0.0, asked("n1", "news", 90, "newsroom")),
        (600.0, asked("r1", "image", 10, "render")),
        (600.0, asked("r2", "image", 10, "render")),
    ]
    h.play(arrivals, SERVICE, until=639.0)  # news starts loading back at 639
    assert starts(h)[-1][:2] == (639.0, "news")
    h.start_failed("news", at=650.0)
    h.tick(700.0)
    h.arrive("r3", "image", 10, at=800.0, app="render")  # image loads for it
    h.tick(900.0)
    assert [(t, b) for t, b, _ in starts(h)] == [
        (0.0, "news"),
        (601.0, "image"),
        (639.0, "news"),
        (800.0, "image"),
    ]


def _stale_day(*operator: tuple[float, AdminLoad | AdminUnload]) -> Harness:
    """news asked for at 0, stopped for the renders at 3,500, wished back at
    3,538 (image idle); a voice request at 3,538.5 waits for a load, which
    withdraws the wish; voice serves until 3,749, when news's demand (3,600 s
    old at 3,600) is stale and the loan ends. ``operator`` acts meanwhile."""
    h = harness({"render": 0.25}, {**PROFILES, "voice": (13.0, 10.0)})
    arrivals = [
        (0.0, asked("n1", "news", 90, "newsroom")),
        (3500.0, asked("r1", "image", 10, "render")),
        (3500.0, asked("r2", "image", 10, "render")),
        *operator,
        (3538.5, asked("v1", "voice", 50, "studio")),
    ]
    h.play(arrivals, {**SERVICE, "v1": 200.0}, until=4200.0)
    return h


def test_an_operators_load_outlives_the_room_given_back() -> None:
    # Without the operator, news's stale demand gets nothing back.
    assert [b for _, b, _ in starts(_stale_day())] == ["news", "image", "voice"]
    # The operator's load at 3,538.2 waits for room (image is stopping). The
    # give-back's wish, withdrawn for voice's request at 3,538.5, took it away
    # with it (voice loaded at 3,539, news never). It is the operator's now:
    # news loads when image has stopped, as asked before voice's request came.
    h = _stale_day((3538.2, AdminLoad(backend="news")))
    assert [(t, b) for t, b, _ in starts(h)] == [
        (0.0, "news"),
        (3501.0, "image"),
        (3539.0, "news"),
        (3580.0, "voice"),  # news idle, stopped for voice in 1 s
    ]
    assert "news was asked for" in starts(h)[2][2]


def test_an_operators_unload_ends_the_loan() -> None:
    # Unloading a stopped backend withdraws a load it waits for: the give-back's
    # too, so news is not loaded back once voice is done (within the hour).
    h = harness({"render": 0.25}, {**PROFILES, "voice": (13.0, 10.0)})
    arrivals = [
        (0.0, asked("n1", "news", 90, "newsroom")),
        (600.0, asked("r1", "image", 10, "render")),
        (600.0, asked("r2", "image", 10, "render")),
        (638.2, AdminUnload(backend="news")),
        (638.5, asked("v1", "voice", 50, "studio")),
    ]
    h.play(arrivals, {**SERVICE, "v1": 20.0}, until=1000.0)
    assert [b for _, b, _ in starts(h)] == ["news", "image", "voice"]

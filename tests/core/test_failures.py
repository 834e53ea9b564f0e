"""Exits, start failures, out-of-memory yard caused itself, lost connections."""

from __future__ import annotations

import math

from tests.core.harness import GIB, Harness, gpu, host
from yard.core import (
    BackendSpec,
    Dispatch,
    Flag,
    Profile,
    ProfileRaised,
    Reject,
    Requeue,
    SchedulerConfig,
    StartBackend,
    StopBackend,
)


def chat_and_tts() -> Harness:
    """chat (10 GiB, 2 slots) and tts (4 GiB) both fit on gpu0 (24 GiB)."""
    return Harness(
        [
            BackendSpec(name="chat", gpus=("gpu0",), slots=2),
            BackendSpec(name="tts", gpus=("gpu0",)),
        ],
        profiles={"chat": (10, 1, 5), "tts": (4, 1, 2)},
    )


def test_a_crash_fails_its_inflight_requests_and_is_never_retried() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.arrive("r2", "chat", at=1)
    out = h.exited("chat", at=2, code=-11)
    assert [(d.request_id, d.status, d.code) for d in out if isinstance(d, Reject)] == [
        ("r1", 502, "backend_failed"),
        ("r2", 502, "backend_failed"),
    ]
    assert "exit code -11" in h.rejected()["r1"].message
    assert h.state("chat") == "failed"
    assert h.tick(100) == []  # no restart loop: nobody needs it


def test_a_crashed_backend_starts_again_when_a_request_needs_it() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.exited("chat", at=2)
    [start] = h.arrive("r2", "chat", at=3)
    assert isinstance(start, StartBackend) and start.backend == "chat"


def test_an_oom_yard_caused_requeues_the_requests_once_at_their_old_place() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.arrive("r2", "chat", at=1)  # both running on chat's two slots
    h.arrive("r3", "chat", at=2)  # waiting
    h.memory("gpu0", used_gib=16, at=3, chat=16)  # above its 10 GiB profile: raised to 16
    out = h.exited("chat", at=4, oom=True)
    assert [d.request_id for d in out if isinstance(d, Requeue)] == ["r1", "r2"]
    [raised] = [d for d in out if isinstance(d, ProfileRaised)]
    assert raised.profile.gpu_bytes == math.ceil(16 * GIB * 1.1)  # 10% above the last
    h.ready("chat", at=10)
    assert h.dispatched()[-2:] == ["r1", "r2"]  # r1 and r2 before r3: their old place


def test_a_request_is_requeued_only_once() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.memory("gpu0", used_gib=12, at=1, chat=12)
    h.exited("chat", at=2, oom=True)
    h.ready("chat", at=3)
    h.memory("gpu0", used_gib=14, at=4, chat=14)
    out = h.exited("chat", at=5, oom=True)
    [reject] = [d for d in out if isinstance(d, Reject)]
    assert (reject.request_id, reject.code) == ("r1", "backend_failed")
    assert "already requeued once" in reject.message


def test_a_raised_profile_that_no_longer_fits_fails_the_waiting_requests() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.memory("gpu0", used_gib=23, at=1, chat=23)
    out = h.exited("chat", at=2, oom=True)
    assert [d.request_id for d in out if isinstance(d, Requeue)] == ["r1"]
    assert h.rejected()["r1"].code == "does_not_fit"


def test_a_restored_request_marked_requeued_is_not_requeued_again() -> None:
    h = chat_and_tts()
    h.arrive("r1", "chat", requeued=True)
    h.ready("chat", at=1)
    h.memory("gpu0", used_gib=23, at=2, chat=23)
    out = h.exited("chat", at=3, oom=True)
    assert [d.request_id for d in out if isinstance(d, Reject)] == ["r1"]


def test_an_oom_yard_did_not_cause_goes_to_the_client() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.memory("gpu0", used_gib=9, at=10, chat=9)  # within its profile, nothing else
    out = h.exited("chat", at=20, oom=True)
    assert [d.request_id for d in out if isinstance(d, Reject)] == ["r1"]
    assert not [d for d in out if isinstance(d, Requeue | ProfileRaised)]


def test_an_oom_during_a_concurrent_load_on_the_device_is_self_caused() -> None:
    h = Harness(
        [BackendSpec(name="a"), BackendSpec(name="b")],
        devices=(host(gib=64),),
        profiles={"a": (0, 8, 1), "b": (0, 8, 1)},
    )
    h.load("a", "ra")
    h.arrive("rb", "b", at=30)  # b loads on host next to busy a
    out = h.exited("a", at=31, oom=True)
    assert [d.request_id for d in out if isinstance(d, Requeue)] == ["ra"]


def test_foreign_memory_that_appeared_after_placement_makes_an_oom_self_caused() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.memory("gpu0", used_gib=24, at=10, chat=10)  # 14 GiB foreign showed up: 11 + 14 > 24
    out = h.exited("chat", at=20, oom=True)
    assert [d.request_id for d in out if isinstance(d, Requeue)] == ["r1"]


def test_a_failed_start_fails_the_requests_waiting_for_it_with_the_detail() -> None:
    h = chat_and_tts()
    h.arrive("r1", "chat")
    h.arrive("r2", "chat", at=1)
    out = h.start_failed("chat", at=2, detail="llama-server: model file not found")
    assert {d.request_id: d.code for d in out if isinstance(d, Reject)} == {
        "r1": "backend_failed",
        "r2": "backend_failed",
    }
    assert "model file not found" in h.rejected()["r1"].message
    assert h.state("chat") == "failed"
    [start] = h.arrive("r3", "chat", at=3)  # a new request tries again
    assert isinstance(start, StartBackend)


def test_a_self_caused_oom_at_start_raises_the_profile_and_keeps_the_requests() -> None:
    h = Harness(
        [BackendSpec(name="a", gpus=("gpu0",)), BackendSpec(name="b", gpus=("gpu1",))],
        devices=(gpu("gpu0"), gpu("gpu1"), host(gib=64)),
        profiles={"a": (4, 8, 1), "b": (4, 8, 1)},
    )
    h.arrive("ra", "a")
    h.arrive("rb", "b")  # two GPUs: both load at once, sharing host memory
    out = h.start_failed("a", at=1, oom=True)
    assert [d for d in out if isinstance(d, ProfileRaised)]
    assert not [d for d in out if isinstance(d, Reject)]
    assert h.started() == ["a", "b", "a"]


def test_an_upstream_lost_request_waits_for_the_exit_report() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.memory("gpu0", used_gib=23, at=1, chat=23)
    assert h.finish("r1", at=2, outcome="upstream_lost") == []
    out = h.exited("chat", at=3, oom=True)
    assert [d.request_id for d in out if isinstance(d, Requeue)] == ["r1"]


def test_an_upstream_lost_request_fails_after_the_grace_period() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    h.finish("r1", at=2, outcome="upstream_lost")
    assert h.s.next_wakeup() == 2 + SchedulerConfig().lost_grace_s
    [reject] = h.tick(7)
    assert isinstance(reject, Reject) and reject.code == "backend_failed"


def test_a_slot_frees_when_a_request_finishes_or_is_cancelled() -> None:
    h = Harness([BackendSpec(name="chat", gpus=("gpu0",))], profiles={"chat": (1, 1, 1)})
    h.load("chat", "r1")
    h.arrive("r2", "chat", at=1)
    h.arrive("r3", "chat", at=1)
    [d] = h.cancel("r1", at=2)
    assert isinstance(d, Dispatch) and d.request_id == "r2"
    h.cancel("r3", at=3)  # cancelled while queued: never dispatched
    h.finish("r2", at=4)
    assert h.dispatched() == ["r1", "r2"]


def test_reports_about_unknown_or_stale_things_are_ignored() -> None:
    h = chat_and_tts()
    assert h.finish("nobody", at=1) == []
    assert h.cancel("nobody", at=1) == []
    assert h.ready("tts", at=1) == []  # never started
    assert h.stopped("chat", at=1) == []
    assert h.exited("ghost", at=1) == []
    assert h.memory("gpu9", used_gib=1, at=1) == []
    assert h.start_failed("chat", at=1) == []
    h.load("chat", "r1")
    h.finish("r1", at=2)
    assert h.finish("r1", at=3) == []  # duplicate


def test_the_load_time_is_learned_when_no_profile_gives_one() -> None:
    h = Harness([BackendSpec(name="chat", gpus=("gpu0",))], devices=(gpu(), host()))
    h.arrive("r1", "chat")
    h.ready("chat", at=12.5)
    assert h.s.snapshot(13).backends[0].last_load_s == 12.5


def test_an_oom_on_a_shared_gpu_with_no_reading_is_self_caused_and_not_repeated() -> None:
    h = Harness(
        [
            BackendSpec(name="big", gpus=("gpu0",), slots=2),
            BackendSpec(name="small", gpus=("gpu0",)),
        ],
        devices=(gpu(gib=18), host()),
        profiles={"big": (10, 1, 20), "small": (4.5, 1, 8)},
    )
    h.load("big", "b1")
    h.load("small", "s1", at=30)
    out = h.exited("big", at=60, oom=True)  # it grew past 10 GiB between readings
    assert [d.request_id for d in out if isinstance(d, Requeue)] == ["b1"]
    [raised] = [d for d in out if isinstance(d, ProfileRaised)]
    assert "shared gpu0 with small" in raised.reason
    # 18 - 4.95 GiB was left for big: it no longer fits next to small
    assert raised.profile.gpu_bytes * 1.1 > (18 - 4.5 * 1.1) * GIB
    [stop] = h.finish("s1", at=61)  # big waits for gpu0 alone
    assert isinstance(stop, StopBackend) and stop.backend == "small"


def test_live_use_above_the_profile_is_flagged_once_and_raises_the_profile_at_once() -> None:
    h = chat_and_tts()
    h.load("chat", "r1")
    flag, raised = h.memory("gpu0", used_gib=12, at=1, chat=12)
    assert isinstance(flag, Flag) and flag.backend == "chat"
    assert flag.reason == "chat: it used 12.0 GiB on gpu0, above its profile 10.0 GiB"
    assert isinstance(raised, ProfileRaised) and raised.backend == "chat"
    assert raised.profile == Profile(gpu_bytes=12 * GIB, host_bytes=GIB, load_s=5.0)
    assert raised.reason == (
        "chat: it used 12.0 GiB on gpu0, above its profile 10.0 GiB; profile raised from "
        "10.0 GiB GPU / 1.0 GiB host to 12.0 GiB / 1.0 GiB"
    )
    assert h.s.profile("chat") == raised.profile
    assert h.s.snapshot(1).devices[0].committed_bytes == math.ceil(12 * GIB * 1.1)
    # Flagged once; raised again only by a reading above the raised figure.
    assert h.memory("gpu0", used_gib=12, at=2, chat=12) == []
    [again] = h.memory("gpu0", used_gib=13, at=3, chat=13)
    assert isinstance(again, ProfileRaised) and again.profile.gpu_bytes == 13 * GIB
    [host_raised] = h.memory("host", used_gib=2, at=4, chat=2)
    assert isinstance(host_raised, ProfileRaised)
    assert (host_raised.profile.gpu_bytes, host_raised.profile.host_bytes) == (13 * GIB, 2 * GIB)

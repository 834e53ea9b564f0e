"""No load that no request waits for makes room by evicting another instance of
its own backend: not a load ahead, not an operator's pin or load of one instance
(the routing binds no request where it would); a request sent to one instance by
name makes room as for any backend."""

from __future__ import annotations

from dataclasses import replace

from tests.core.harness import GIB, Harness, of
from tests.core.test_instances_ahead import NEAR, NEWS, NEWS_2, OPENS, announce, harness
from yard.core import BackendSpec, Decision, Flag, ProfileMeasured, StartBackend, StopBackend
from yard.core.events import AdminLoad, AdminPin


def pin(h: Harness, name: str, at: float) -> list[Decision]:
    return h.feed(AdminPin(backend=name, pinned=True), at)


def test_a_pinned_instance_does_not_evict_its_idle_sibling() -> None:
    one_gpu = tuple(replace(s, gpus=("gpu0",)) for s in (NEWS, NEWS_2))
    h = harness(specs=one_gpu)
    h.load("news", "r1", at=0)
    h.finish("r1", at=100)
    out = pin(h, "news@2", at=110)
    assert not of(StopBackend, out) and not of(StartBackend, out)
    assert h.state("news") == "ready" and h.state("news@2") == "stopped"
    [flag] = of(Flag, out)
    assert flag.backend == "news@2"
    assert flag.reason.startswith("admin pin: news@2 is pinned; not loading it now: ")
    assert "news is another instance of the same backend" in flag.reason
    assert not of(StopBackend, h.tick(500))


def test_a_pinned_instance_makes_room_from_others_than_its_siblings() -> None:
    # chat is slower to reload than news: evicting news would cost less.
    chat = BackendSpec(name="chat", gpus=("gpu1",))
    h = harness(chat, profiles={"news": (14, 2, 40), "chat": (14, 2, 60)})
    h.load("news", "r1", at=0)
    h.finish("r1", at=100)
    h.load("chat", "c1", at=101)
    h.finish("c1", at=200)
    assert h.state("news") == "ready" and h.state("chat") == "ready"
    out = pin(h, "news@2", at=210)
    [stop] = of(StopBackend, out)
    assert stop.backend == "chat"
    [start] = of(StartBackend, h.stopped("chat", at=211))
    assert (start.backend, start.gpus) == ("news@2", ("gpu1",))


ONE_GPU = tuple(replace(s, gpus=("gpu0",)) for s in (NEWS, NEWS_2))


def test_an_operators_load_of_one_instance_does_not_evict_its_sibling() -> None:
    h = harness(specs=ONE_GPU)
    h.load("news", "r1", at=0)
    h.finish("r1", at=100)
    out = h.feed(AdminLoad(backend="news@2"), at=110)
    assert not of(StopBackend, out) and not of(StartBackend, out)
    [flag] = of(Flag, out)
    assert flag.reason.startswith("admin load: not loading news@2 now: waiting for gpu0")
    assert "news is another instance of the same backend" in flag.reason


def test_a_request_sent_to_one_instance_by_name_makes_room_as_for_any_backend() -> None:
    # Its wait stays bounded: it does not wait for the sibling to go by itself.
    h = harness(specs=ONE_GPU)
    h.load("news", "r1", at=0)
    h.finish("r1", at=100)
    [stop] = of(StopBackend, h.arrive("r2", "news@2", at=110))
    assert stop.backend == "news"
    [start] = of(StartBackend, h.stopped("news", at=111))
    assert start.backend == "news@2"


def test_a_backend_with_the_same_options_is_refused_for_its_own_reasons() -> None:
    # news@2 (readied for an announcement) and other load alike on gpu0; news
    # refuses news@2 as its sibling, and other because its window ranks higher.
    other = BackendSpec(name="other", gpus=("gpu0",))
    h = harness(other, specs=ONE_GPU, profiles={"news": (14, 2, 40), "other": (14, 2, 40)})
    h.load("news", "r1", at=0)
    h.finish("r1", at=100)
    h.feed(announce(3), at=110)
    h.tick(NEAR)
    out = h.arrive("o1", "other", at=OPENS - 30)
    # A profile read again plans every load afresh in one round: news@2, then other.
    again = ProfileMeasured(backend="other", gpu_bytes=14 * GIB, host_bytes=2 * GIB, load_s=40)
    out += h.feed(again, at=OPENS - 29)
    assert not of(StopBackend, out) and not of(StartBackend, out)
    view = h.s.explain("o1", h.now)
    assert view is not None
    assert "cannot make room: keeping news: 3 announced requests" in view.reason
    assert "another instance" not in view.reason

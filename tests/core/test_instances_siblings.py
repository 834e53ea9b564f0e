"""No load makes room by evicting another instance of its own backend: not the
routing, not a load ahead, not an operator's pin of one instance."""

from __future__ import annotations

from dataclasses import replace

from tests.core.harness import Harness, of
from tests.core.test_instances_ahead import NEWS, NEWS_2, harness
from yard.core import BackendSpec, Decision, Flag, StartBackend, StopBackend
from yard.core.events import AdminPin


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

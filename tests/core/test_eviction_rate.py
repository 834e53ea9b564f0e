"""The eviction order reads each backend's arrival rate (yard.core.victims.demand):
a backend in constant use goes after one idle for long, however cheap it is to
reload, where it has no other GPU to go to."""

from __future__ import annotations

from tests.core.harness import Harness, gpu, host
from yard.core import BackendSpec, StopBackend

# Reload seconds per GiB reserved (x1.1): chat 12 / 5.5 = 2.2, news 40 / 15.4 = 2.6.
PROFILES: dict[str, tuple[float, float, float]] = {
    "chat": (5, 0, 12),
    "news": (14, 0, 40),
    "image": (7, 0, 25),
}


def radio(gpus: tuple[str, ...] = ("gpu0",)) -> Harness:
    """chat and news fit together on a 24 GiB GPU (20.9 GiB reserved); image
    (7.7 GiB) needs one of them to go."""
    return Harness(
        [BackendSpec(name=n, gpus=gpus, slots=4 if n == "chat" else 1) for n in PROFILES],
        devices=(*(gpu(g, gib=24) for g in gpus), host()),
        profiles=PROFILES,
    )


def chat_every(h: Harness, seconds: float, start: float, until: float) -> None:
    """A chat request every ``seconds`` from ``start``, each served in one second."""
    t, n = start, 0
    while t < until:
        h.arrive(f"chat-{n}", "chat", at=t)
        h.finish(f"chat-{n}", at=t + 1)
        t, n = t + seconds, n + 1


def test_a_backend_in_constant_use_is_not_evicted_before_one_idle_for_long() -> None:
    h = radio()
    h.load("news", "script", at=0)
    h.finish("script", at=90)
    h.load("chat", "chat-first", at=100)
    h.finish("chat-first", at=101)
    chat_every(h, 5, start=105, until=1300)  # news idle for twenty minutes
    # 24 - 5.5 - 15.4 = 3.1 GiB free, image needs 7.7: chat alone would do,
    # and is the cheapest per GiB; it is needed again in seconds.
    h.arrive("art", "image", priority=40, at=1300)
    assert h.stops() == ["news"]
    [stop] = h.decisions(StopBackend)
    assert "least demand: fewest recent requests for its reload cost" in stop.reason
    assert "cheapest" not in stop.reason  # news is the dearer of the two per GiB


def test_among_backends_as_idle_the_cheapest_per_gib_still_goes_first() -> None:
    h = radio()
    h.load("news", "script", at=0)
    h.finish("script", at=1)
    h.load("chat", "chat-first", at=1)
    h.finish("chat-first", at=2)
    h.arrive("art", "image", priority=40, at=1300)
    assert h.stops() == ["chat"]  # one arrival each, a second apart


def test_a_backend_used_often_that_may_load_on_another_gpu_may_move() -> None:
    """On two GPUs chat, evicted, loads again on the other GPU without evicting
    anything: it is ranked by GreedyDual-Size credit alone (cheapest first)."""
    h = radio(("gpu0", "gpu1"))
    h.memory("gpu1", used_gib=19)  # another program: chat does not fit there
    h.load("news", "script", at=0)
    h.finish("script", at=90)
    h.load("chat", "chat-first", at=100)
    h.finish("chat-first", at=101)
    chat_every(h, 5, start=105, until=1300)
    # 7 GiB free on gpu1 now: room for chat (5.5), not for image (7.7)
    h.memory("gpu1", used_gib=17, at=1300)
    h.arrive("art", "image", priority=40, at=1300)
    assert h.stops() == ["chat"]
    [stop] = h.decisions(StopBackend)
    assert "may load on another GPU too: lowest GreedyDual-Size credit" in stop.reason
    view = h.s.explain("art", 1300)
    assert view is not None and "stopping idle chat (may load on another GPU" in view.reason
    h.stopped("chat", at=1301)
    h.arrive("chat-back", "chat", at=1302)
    assert h.started()[-2:] == ["image", "chat"]
    assert [b.gpus for b in h.s.snapshot(1302).backends if b.name == "chat"] == [("gpu1",)]

"""``[apps.NAME] max_concurrent`` in the core's dispatch: an app never has more
requests dispatched at once; while it has that many, the next request of
another app goes, and its own wait with a reason naming the limit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.harness import GIB, Harness, host, of
from yard.core import (
    BackendSpec,
    Decision,
    Dispatch,
    ProfileMeasured,
    Reject,
    Requeue,
    Scheduler,
    SchedulerConfig,
    StartBackend,
    StopBackend,
)

LIMITS = {"radio": 1, "batch": 2}


def harness(backends: list[BackendSpec], limits: dict[str, int] = LIMITS) -> Harness:
    h = Harness(backends, devices=(host(),))
    h.s = Scheduler((host(),), backends, SchedulerConfig(), max_concurrent=limits)
    for b in backends:  # measured: loads need not wait for a clean measurement
        h.feed(
            ProfileMeasured(
                backend=b.name, gpu_bytes=0, host_bytes=GIB, load_s=1.0, source="stored"
            )
        )
    return h


def test_an_app_at_its_limit_waits_while_other_apps_go() -> None:
    h = harness([BackendSpec(name="llm", slots=3)])
    h.arrive("r1", "llm", priority=90, app="radio")
    h.arrive("r2", "llm", priority=90, app="radio")
    h.arrive("c1", "llm", priority=10, app="chat")
    assert [d.request_id for d in of(Dispatch, h.ready("llm", at=5.0))] == ["r1", "c1"]
    # r2 outranks nothing that may go: it waits for radio's request, not a slot.
    view = h.s.explain("r2", h.now)
    assert view is not None and view.reason == (
        "app 'radio' has 1 requests being served, the most [apps.radio] max_concurrent = 1 "
        "allows; it goes when one of them ends"
    )
    h.arrive("c2", "llm", priority=10, app="chat", at=6.0)
    assert h.dispatched() == ["r1", "c1", "c2"]
    h.finish("c1", at=7.0)  # a free slot, but radio still has one being served
    assert h.dispatched() == ["r1", "c1", "c2"]
    assert [d.request_id for d in of(Dispatch, h.finish("r1", at=8.0))] == ["r2"]


def test_the_limit_counts_across_backends() -> None:
    h = harness([BackendSpec(name="llm", slots=2), BackendSpec(name="tts", slots=2)])
    assert of(StartBackend, h.arrive("b1", "llm", app="batch"))
    h.ready("llm", at=1.0)
    assert of(StartBackend, h.arrive("b2", "tts", app="batch", at=2.0))
    h.arrive("b3", "tts", app="batch")
    h.ready("tts", at=3.0)
    assert h.dispatched() == ["b1", "b2"]
    h.finish("b1", at=4.0)
    assert h.dispatched() == ["b1", "b2", "b3"]


# -- never exceeded, and nobody is held for ever --------------------------------

APPS = ("radio", "batch", "chat")
BACKENDS = [BackendSpec(name="llm", slots=3), BackendSpec(name="tts", slots=1)]

op = st.one_of(
    st.tuples(
        st.just("arrive"),
        st.sampled_from(APPS),
        st.sampled_from(["llm", "tts"]),
        st.integers(0, 100),
    ),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("lost"), st.integers(0, 50)),
    st.tuples(st.just("wait"), st.floats(0.1, 30.0)),
)


class Driver:
    """Carries out the core's decisions at once and tracks what is dispatched."""

    def __init__(self) -> None:
        self.h = harness(BACKENDS)
        self.app_of: dict[str, str] = {}
        self.waiting: set[str] = set()
        self.running: set[str] = set()
        self.ended: set[str] = set()

    def feed(self, decisions: list[Decision]) -> None:
        todo = list(decisions)
        while todo:
            d = todo.pop(0)
            if isinstance(d, StartBackend):
                todo += self.h.ready(d.backend)
            elif isinstance(d, StopBackend):
                todo += self.h.stopped(d.backend)
            elif isinstance(d, Dispatch):
                self.waiting.discard(d.request_id)
                self.running.add(d.request_id)
            elif isinstance(d, Requeue):
                self.running.discard(d.request_id)
                self.waiting.add(d.request_id)
            elif isinstance(d, Reject):
                self.waiting.discard(d.request_id)
                self.running.discard(d.request_id)
                self.ended.add(d.request_id)
            self.check()

    def check(self) -> None:
        for app, limit in LIMITS.items():
            serving = sum(self.app_of[r] == app for r in self.running)
            assert serving <= limit, f"{app}: {serving} dispatched, max_concurrent {limit}"

    def end(self, rid: str) -> None:
        self.running.discard(rid)
        self.waiting.discard(rid)
        self.ended.add(rid)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=60))
def test_max_concurrent_is_never_exceeded_and_every_request_ends(
    ops: list[tuple[object, ...]],
) -> None:
    d = Driver()
    h = d.h
    for n, step in enumerate(ops):
        kind = step[0]
        if kind == "arrive":
            _, app, backend, priority = step
            rid = f"q{n}"
            d.app_of[rid] = str(app)
            d.waiting.add(rid)
            d.feed(h.arrive(rid, str(backend), float(str(priority)), app=str(app)))
        elif kind == "wait":
            d.feed(h.tick(h.now + float(str(step[1]))))
        else:
            pool = sorted(d.running) if kind in ("finish", "lost") else sorted(d.waiting)
            if not pool:
                continue
            rid = pool[int(str(step[1])) % len(pool)]
            if kind == "finish":
                d.end(rid)
                d.feed(h.finish(rid))
            elif kind == "lost":
                d.feed(h.finish(rid, outcome="upstream_lost"))
            else:
                d.end(rid)
                d.feed(h.cancel(rid))
    # Then every request served runs to its end (a lost one is ended by its
    # grace timer): nobody waits for ever behind an app's limit.
    for _ in range(10 * len(ops) + 10):
        if not d.waiting and not d.running:
            break
        done = sorted(d.running)
        for rid in done:
            if rid in d.running:
                d.end(rid)
                d.feed(h.finish(rid))
        d.feed(h.tick(h.now + 60.0))
    assert not d.waiting and not d.running
    assert d.ended == set(d.app_of)

"""A round plans again only what an event changed (yard.core.planning).

These pin the cases where a plan is *reused*: an evicting plan whose victim
changed in nothing its plan read, and plans that a touched backend cannot
answer otherwise. ``test_planning.py`` and ``test_machine.py`` check that
reuse decides and explains as a full re-plan does; these check that it
happens (each fails if the round plans the swap afresh).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.harness import Harness, gpu, host
from yard.core import BackendSpec, SchedulerConfig, StopBackend, placement
from yard.core.plans import Plan
from yard.core.records import Backend

# They count the calls the round makes to placement.best_plan by replacing it: the
# compiled core calls its own (yard.compiled), so these run on the plain core.
pytestmark = pytest.mark.pure_core


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The backends placement.best_plan was asked about, in order."""
    asked: list[str] = []
    best_plan = placement.best_plan

    def counted(b: Backend, *args: Any, **kwargs: Any) -> Plan | None:
        asked.append(b.name)
        return best_plan(b, *args, **kwargs)

    monkeypatch.setattr(placement, "best_plan", counted)
    return asked


def _draining_chat(batch_bound: int = 0) -> Harness:
    """chat (two slots, both busy) drains so that big can load in its place;
    one more request waits for chat, ranked below big's."""
    h = Harness(
        [
            BackendSpec(name="chat", gpus=("gpu0",), slots=2),
            BackendSpec(name="big", gpus=("gpu0",)),
        ],
        devices=(gpu(gib=24), host()),
        config=SchedulerConfig(batch_bound=batch_bound),
        profiles={"chat": (14, 1, 5.0), "big": (14, 1, 20.0)},
    )
    h.load("chat", "r0", at=0)
    h.arrive("r1", "chat", at=1)
    h.arrive("b1", "big", priority=90, at=2)
    h.arrive("r2", "chat", priority=10, at=3)
    assert h.state("chat") == "draining"
    return h


def test_a_finish_that_leaves_the_victim_busy_does_not_plan_the_swap_again(
    plans: list[str],
) -> None:
    h = _draining_chat()
    why = h.s.explain("b1", h.now)
    assert why is not None
    plans.clear()
    assert h.finish("r0", at=4) == []
    assert plans == []  # chat is still busy and drains: the swap's plan stands
    after = h.s.explain("b1", h.now)
    assert after is not None and after.reason == why.reason
    [stop] = h.finish("r1", at=5)  # now idle: the plan changes, chat stops
    assert isinstance(stop, StopBackend) and stop.backend == "chat"
    assert plans == []  # nor then: the swap is worked out again from its victims


def test_a_victim_that_goes_idle_is_stopped_by_the_swap_worked_out_again_from_its_victims(
    plans: list[str],
) -> None:
    h = _draining_chat()
    h.finish("r0", at=4)
    plans.clear()
    [stop] = h.finish("r1", at=5)  # chat idle: stopped now, not drained
    assert isinstance(stop, StopBackend) and stop.backend == "chat"
    assert plans == []  # whom big evicts stands: only how chat goes changed
    why = h.s.explain("b1", h.now)
    assert why is not None and "stopping idle chat" in why.reason


def test_an_arrival_for_the_draining_victim_does_not_plan_the_swap_again(
    plans: list[str],
) -> None:
    h = _draining_chat()
    plans.clear()
    h.arrive("r3", "chat", priority=10, at=4)
    assert plans == []
    assert h.state("chat") == "draining"


def test_an_overtake_of_a_swap_tells_its_plan_again_without_planning_it_afresh(
    plans: list[str],
) -> None:
    # chat (one slot, busy) is big's victim; requests for chat wait, and while
    # big's head may still be overtaken (batch_bound 3) chat serves them first.
    h = Harness(
        [
            BackendSpec(name="chat", gpus=("gpu0",), slots=1),
            BackendSpec(name="big", gpus=("gpu0",)),
        ],
        devices=(gpu(gib=24), host()),
        config=SchedulerConfig(batch_bound=3),
        profiles={"chat": (14, 1, 5.0), "big": (14, 1, 20.0)},
    )
    h.load("chat", "r0", at=0)
    h.arrive("r1", "chat", at=1)
    h.arrive("r2", "chat", at=1)
    h.arrive("b1", "big", priority=90, at=2)
    before = h.s.explain("b1", h.now)
    assert before is not None and "3 more" in before.reason
    plans.clear()
    h.finish("r0", at=3)  # r1 goes ahead of the swap: b1 overtaken once
    assert plans == []  # worked out again from its victims, not planned afresh
    after = h.s.explain("b1", h.now)
    assert after is not None and "2 more" in after.reason

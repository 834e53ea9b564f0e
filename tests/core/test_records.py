"""The core's records keep what planning reads often at hand (yard.core.records)."""

from __future__ import annotations

import math
import random

from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.core.catalog import new_backend
from yard.core.estimates import service_hi
from yard.core.plans import NoRoom
from yard.core.queue import Req, ReqState, RequestQueue
from yard.core.records import SERVICE_WINDOW


def test_the_longest_recent_service_follows_the_window_as_samples_leave_it() -> None:
    b = new_backend(BackendSpec(name="chat", gpus=("gpu0",)), SchedulerConfig())
    rng = random.Random(3)
    # a long one first: it must stop counting once SERVICE_WINDOW more came
    b.note_service(500.0)
    for i in range(3 * SERVICE_WINDOW):
        b.note_service(rng.choice((rng.uniform(0.1, 10.0), 50.0 - i / 10)))
        assert b.service_recent_max == max(b.service_recent)
    assert b.service_recent_max < 500.0


def test_a_reason_told_by_name_is_the_sentence_it_tells_that_backend() -> None:
    b = new_backend(BackendSpec(name="chat", gpus=("gpu0",)), SchedulerConfig())
    assert b.wait_reason == ""
    told = NoRoom("gpu0", 14 * 1024**3, 3 * 1024**3, ("big refuses",))
    b.waiting_why = told
    assert b.wait_reason == told("chat")
    assert "chat" in b.wait_reason
    b.wait_reason = "waiting for its stop"
    assert b.wait_reason == "waiting for its stop"


def test_the_worst_drain_is_the_longest_high_service_estimate_of_the_others() -> None:
    config = SchedulerConfig(default_service_s=5.0)
    names = [f"m{i}" for i in range(6)]
    devices = [DeviceSpec(name="gpu0", kind="gpu", total_bytes=24 * 1024**3)]
    s = Scheduler(devices, [BackendSpec(name=n, gpus=("gpu0",)) for n in names], config)
    core = s._core
    rng = random.Random(5)
    for _ in range(1_000):
        b = core.backends[rng.choice(names)]
        # ties on purpose (a few figures, the default among them); estimates
        # that fall as long ones leave the window and the average moves down
        sample = rng.choice((0.5, 1.0, 5.0, 7.0, 7.0, 30.0) if rng.random() < 0.2 else (0.5, 1.0))
        ewma = b.service_ewma
        b.service_ewma = sample if ewma is None else 0.7 * ewma + 0.3 * sample
        b.note_service(sample)
        core.service_noted(b)  # as a finish tells it
        for o in core.backends.values():
            others = [service_hi(x, config) for x in core.backends.values() if x is not o]
            assert core.worst_drain(o) == max(others, default=0.0)


def test_a_queues_start_bys_follow_every_request_with_one_that_comes_or_goes() -> None:
    """start_bys (and start_by_latest) are kept between changes that cannot move
    them: a request without a start-by coming or going. Those with one always
    count, whether they leave by dispatch or by a move to another queue."""
    rng = random.Random(11)
    queue = RequestQueue(boost=10.0)
    waiting: list[Req] = []
    for i in range(400):
        if waiting and rng.random() < 0.45:
            req = waiting.pop(rng.randrange(len(waiting)))
            if rng.random() < 0.5:
                req.state = ReqState.RUNNING  # dispatched (Core.unqueue)
            else:
                req.gen += 1  # moved to a sibling's queue (instances._move)
            queue.removed(req)
        else:
            start_by = rng.uniform(0.0, 500.0) if rng.random() < 0.3 else None
            req = Req(f"r{i}", "chat", 50, "", float(i), -float(i), start_by, True, False)
            queue.push(req)
            waiting.append(req)
        expected = tuple(sorted(r.start_by for r in waiting if r.start_by is not None))
        assert queue.start_bys() == expected
        latest = min((sb - 5.0 - (k // 2) * 3.0 for k, sb in enumerate(expected)), default=math.inf)
        assert queue.start_by_latest(2, 3.0, 5.0) == latest

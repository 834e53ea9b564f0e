"""Ten jobs, three models, one deadline: exactly one order comes out.

gpu0 has 20 GiB and any two of the three models fit on it (llm 11 GiB, img
7.7 GiB, tts 3.3 GiB with the margin), never all three. Derived by hand:

- t=0  j1 starts llm loading (10 s); img and tts wait: one load at a time.
- t=6  j7 arrives for tts with start-by 40: urgent at once (its window is
       wider than its slack), so it outranks j9 (priority 90) for the next load.
- t=10 llm is ready: j4 (priority 90) goes before j1, j8; tts starts loading
       (2 s) next to llm.
- t=12 tts is ready: j7 starts, 28 s before its deadline. img (its best
       request j9 ranks above everything tts has waiting) needs 7.7 GiB and only
       5.7 are free: tts, cheapest to reload per GiB, must make room, but serves
       j3, j10, j5 first (three overtakes of j9's swap, batch_bound 4) until its
       queue is empty.
- t=32 tts stops (1 s); img loads from t=33 to 39, then j9, j2, j6 by rank.
- llm meanwhile: j4 until 30, j1 until 50, then j8.
"""

from __future__ import annotations

from tests.core.harness import Harness, gpu, host
from yard.core import BackendSpec, RequestArrived

JOBS = [  # time, id, backend, priority, service s, start_by
    (0, "j1", "llm", 50, 20, None),
    (1, "j2", "img", 50, 10, None),
    (2, "j3", "tts", 50, 5, None),
    (3, "j4", "llm", 90, 20, None),
    (4, "j5", "tts", 10, 5, None),
    (5, "j6", "img", 50, 10, None),
    (6, "j7", "tts", 50, 5, 40.0),
    (7, "j8", "llm", 10, 20, None),
    (8, "j9", "img", 90, 10, None),
    (9, "j10", "tts", 50, 5, None),
]


def test_ten_jobs_three_models_one_deadline_give_exactly_one_order() -> None:
    h = Harness(
        [BackendSpec(name=n, gpus=("gpu0",)) for n in ("llm", "img", "tts")],
        devices=(gpu(gib=20), host()),
        profiles={"llm": (10, 0, 10), "img": (7, 0, 6), "tts": (3, 0, 2)},
    )
    arrivals = [
        (float(t), RequestArrived(request_id=rid, backend=b, priority=p, start_by=sb))
        for t, rid, b, p, _, sb in JOBS
    ]
    h.play(arrivals, {rid: float(svc) for _, rid, _, _, svc, _ in JOBS}, until=200)
    assert h.dispatch_times() == [
        (10, "j4"),
        (12, "j7"),
        (17, "j3"),
        (22, "j10"),
        (27, "j5"),
        (30, "j1"),
        (39, "j9"),
        (49, "j2"),
        (50, "j8"),
        (59, "j6"),
    ]
    assert h.started() == ["llm", "tts", "img"]
    assert h.stops() == ["tts"]
    assert h.rejected() == {}

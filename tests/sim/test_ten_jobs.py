"""Ten jobs, three models, one deadline: exactly one order comes out."""

from __future__ import annotations

from sim import scenarios
from sim.runner import run
from yard.core.decisions import StartBackend, StopBackend


def test_ten_jobs_three_models_one_deadline_dispatch_in_exactly_one_order() -> None:
    """One 20 GiB GPU, no reserve; stored profiles (reservations with the 1.10
    margin): llm 11 GiB, image 8.8 GiB, tts 6.6 GiB, so any two fit and three do
    not. Loads take 20 / 10 / 5 s, a stop 1 s; each backend has one slot; aging is
    1 point per second, so effective priority = priority + seconds waited.

    Arrivals (time, id, backend, priority, service): 0 j01 llm 50 30s, 1 j02 llm 50,
    2 j03 image 20 10s, 3 j04 tts 80 5s, 4 j05 llm 10, 5 j06 image 60, 10 j07 tts 30,
    12 j08 image 40 start-by 90, 15 j09 llm 70, 22 j10 tts 90.

    - 0: j01 needs llm; the GPU is empty: start llm (ready at 20). Nothing else may
      load on gpu0 meanwhile (one load per device).
    - 20: llm ready. Its queue: j09 70+5=75 beats j01 70, j02 69, j05 26: j09 runs
      20-50. The next load: 9 GiB free; tts' head j04 (80+17=97) beats image's
      head j06 (60+15=75): start tts (ready at 25).
    - 25: tts ready: j04 (80+22=102) beats j10 (90+3=93) and j07: j04 runs 25-30.
    - 30: j10 (98) beats image's head j06 (85): j10 runs 30-35.
    - 35: j07 (55) is below j06 (90), but tts is loaded and the swap to image must
      wait for tts to be idle anyway; j07 goes ahead of the swap (overtake 1 of the
      batch bound's 4): 35-40.
    - 40: tts idle and nothing waits for it: stop it to make room for image (2.4 GiB
      free, 8.8 needed); stopped at 41, image starts at 41 (ready at 51).
    - 50: j09 done; llm: j01 (100) beats j02 (99) and j05 (56): j01 runs 50-80.
    - 51: image ready. j08 became urgent at 50 (deadline 90 minus a 10 s load minus
      the 30 s urgency window) and carries the deadline boost: j08 runs 51-61,
      meeting its start-by of 90; then j06 (116) 61-71, then j03 71-81.
    - 80: j02 (129) before j05 (86): j02 runs 80-110, j05 110-140.
    """
    result = run(scenarios.ten_jobs(), "yard", keep_log=True)
    dispatched = sorted(
        (r.dispatches[0], r.arrival.request_id) for r in result.records if r.dispatches
    )
    assert dispatched == [
        (20.0, "j09"),
        (25.0, "j04"),
        (30.0, "j10"),
        (35.0, "j07"),
        (50.0, "j01"),
        (51.0, "j08"),
        (61.0, "j06"),
        (71.0, "j03"),
        (80.0, "j02"),
        (110.0, "j05"),
    ]
    assert [(t, b) for t, b, _ in result.launches] == [(0.0, "llm"), (20.0, "tts"), (41.0, "image")]
    assert result.log is not None
    kinds = [(line.split()[0], line.split()[1].partition("(")[0]) for line in result.log]
    assert [t for t, kind in kinds if kind == StopBackend.__name__] == ["40.000000"]
    assert [t for t, kind in kinds if kind == StartBackend.__name__] == [
        "0.000000",
        "20.000000",
        "41.000000",
    ]
    assert all(r.outcome == "ok" for r in result.records)
    assert result.end_time == 140.0
    # The GPU loaded during 0-25 (llm, then tts) and 41-51 (image), and served
    # something the rest of the time.
    assert result.gpu_seconds["gpu0"] == {
        "loading": 35.0,
        "serving": 105.0,
        "idle_with_work": 0.0,
        "idle": 0.0,
    }

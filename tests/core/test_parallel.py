"""Optional resources: the slot count. The context grows first, to its maximum;
then the slots, as many as fit; a running instance serves that many at once."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.core.harness import GIB, Harness, host, of
from yard.core import (
    BackendSpec,
    Dispatch,
    ProfileMeasured,
    SchedulerConfig,
    StartBackend,
)
from yard.core.resources import STEP, choose, learn, need_at, path_ends
from yard.core.spec import HOST, Profile

MIB = 1024 * 1024
SPAN = (4096, 16384)
SLOTS = (1, 8)
PER_TOKEN = 64 * 1024  # 12288 tokens more: 768 MiB
PER_SLOT = 1024 * MIB  # at the maximum context, each slot 1 GiB more


def profile() -> Profile:
    """2 GiB at (4096, 1), 64 KiB per token, 1 GiB per slot (at 16384 tokens)."""
    return Profile(
        gpu_bytes=0,
        host_bytes=2 * GIB,
        load_s=3,
        context=4096,
        host_per_token=PER_TOKEN,
        gpu_per_token=0.0,
        parallel=1,
        host_per_slot=PER_SLOT,
        gpu_per_slot=0.0,
    )


def spec(**kw: object) -> BackendSpec:
    return BackendSpec(name="llm", context=SPAN, parallel=SLOTS, **kw)  # type: ignore[arg-type]


def test_with_room_for_everything_both_reach_their_maximum() -> None:
    choice = choose(spec(), profile(), (), 1.0, {HOST: 64 * GIB})
    assert choice is not None
    assert (choice.context, choice.parallel) == (16384, 8)
    # 2 GiB + 768 MiB + 7 x 1 GiB
    assert choice.need == {HOST: 9 * GIB + 768 * MIB}
    assert "context 16384 (of 4096-16384): its maximum fits" in choice.why
    assert "8 slots (of 1-8): its maximum fits" in choice.why


def test_slots_grow_only_once_the_context_is_at_its_maximum() -> None:
    # 2.5 GiB free: the context reaches 12288 (2 GiB + 8192 x 64 KiB), no more
    choice = choose(spec(), profile(), (), 1.0, {HOST: 2 * GIB + 512 * MIB})
    assert choice is not None
    assert (choice.context, choice.parallel) == (12288, 1)
    assert (
        "; 1 slot (of 1-8): its minimum, since the context grows first and is below its "
        "maximum" in choice.why
    )


def test_the_most_slots_that_fit_after_the_context() -> None:
    # 6 GiB free: 2.75 GiB at (16384, 1), then 3 more slots of 1 GiB
    choice = choose(spec(), profile(), (), 1.0, {HOST: 6 * GIB})
    assert choice is not None
    assert (choice.context, choice.parallel) == (16384, 4)
    assert choice.need == {HOST: 5 * GIB + 768 * MIB}
    assert "4 slots (of 1-8): the most that fit next to the others" in choice.why


def test_the_margin_applies_to_the_slots_too() -> None:
    # x1.5: 4.125 GiB at (16384, 1), 1.5 GiB per slot; 9 GiB -> 4 slots (8.625 GiB)
    choice = choose(spec(), profile(), (), 1.5, {HOST: 9 * GIB})
    assert choice is not None
    assert (choice.context, choice.parallel) == (16384, 4)
    assert all(n <= 9 * GIB for n in choice.need.values())


def test_slots_alone_without_a_context_range() -> None:
    alone = BackendSpec(name="tts", parallel=(2, 6))
    point = Profile(gpu_bytes=0, host_bytes=GIB, load_s=1, parallel=2, host_per_slot=256 * MIB)
    choice = choose(alone, point, (), 1.0, {HOST: 2 * GIB})
    assert choice is not None
    assert (choice.context, choice.parallel) == (None, 6)
    choice = choose(alone, point, (), 1.0, {HOST: GIB + 700 * MIB})
    assert choice is not None and choice.parallel == 4
    assert choice.why == "4 slots (of 2-6): the most that fit next to the others"


def test_a_first_load_takes_both_maxima_and_one_point_keeps_its_count() -> None:
    choice = choose(spec(), None, (), 1.0, {HOST: 64 * GIB})
    assert choice is not None and (choice.context, choice.parallel) == (16384, 8)
    assert "8 slots (of 1-8): its maximum, measured on this first load" in choice.why
    one = Profile(gpu_bytes=0, host_bytes=9 * GIB, load_s=3, context=16384, parallel=8)
    choice = choose(spec(), one, (), 1.0, {HOST: 64 * GIB})
    assert choice is not None and (choice.context, choice.parallel) == (16384, 8)
    assert "8 slots (of 1-8): the count measured so far" in choice.why


def test_the_slot_slope_is_learned_from_two_counts_at_one_context() -> None:
    at_max = Profile(gpu_bytes=0, host_bytes=3 * GIB, load_s=3, context=16384, parallel=1)
    both = Profile(gpu_bytes=0, host_bytes=10 * GIB, load_s=3, context=16384, parallel=8)
    learned = learn(at_max, both)
    assert learned.host_per_slot == GIB and learned.gpu_per_slot == 0.0
    assert learned.host_per_token is None  # the context did not change
    # two points differing in both settings teach neither
    low = Profile(gpu_bytes=0, host_bytes=2 * GIB, load_s=3, context=4096, parallel=1)
    assert learn(low, both).host_per_slot is None
    # and the token slope is kept where the next point moved the slots only
    line = learn(low, at_max)
    assert line.host_per_token == GIB / 12288
    assert learn(line, both).host_per_token == GIB / 12288


def test_need_moves_along_both_lines() -> None:
    # 2 GiB + 12288 x 64 KiB + 2 x 1 GiB
    assert need_at(profile(), (), 1.0, 16384, 3) == {HOST: 4 * GIB + 768 * MIB}


def harness() -> Harness:
    """llm (the profile above) and other (8 GiB) on 16 GiB of host."""
    h = Harness(
        [spec(), BackendSpec(name="other")],
        devices=(replace(host(16), per_process=True),),
        config=SchedulerConfig(profile_margin=1.0),
        profiles={"other": (0, 8, 5)},
    )
    p = profile()
    h.feed(
        ProfileMeasured(
            backend="llm",
            gpu_bytes=p.gpu_bytes,
            host_bytes=p.host_bytes,
            load_s=p.load_s,
            context=p.context,
            gpu_per_token=p.gpu_per_token,
            host_per_token=p.host_per_token,
            parallel=p.parallel,
            gpu_per_slot=p.gpu_per_slot,
            host_per_slot=p.host_per_slot,
        )
    )
    return h


def test_a_start_next_to_others_gets_what_fits_and_serves_that_many_at_once() -> None:
    h = harness()
    h.load("other", "r0")
    # 8 GiB free: 2.75 GiB at (16384, 1), 5 more slots
    starts = of(StartBackend, h.arrive("r1", "llm", at=1))
    assert [(s.context, s.parallel) for s in starts] == [(16384, 6)]
    assert "6 slots (of 1-8): the most that fit next to the others" in starts[0].reason
    for i in range(2, 9):
        h.arrive(f"r{i}", "llm", at=1)
    h.ready("llm", at=2)
    running = [d.request_id for d in h.decisions(Dispatch) if d.backend == "llm"]
    assert running == ["r1", "r2", "r3", "r4", "r5", "r6"]
    view = next(b for b in h.s.snapshot(2).backends if b.name == "llm")
    assert (view.context, view.parallel, view.slots, view.inflight) == (16384, 6, 6, 6)
    h.finish("r1", at=3)
    assert [d.request_id for d in h.decisions(Dispatch) if d.backend == "llm"][-1] == "r7"


def test_a_raise_keeps_the_reservation_at_the_running_settings() -> None:
    h = harness()
    h.load("other", "r0")
    h.arrive("r1", "llm", at=1)  # (16384, 6): 7.75 GiB
    h.ready("llm", at=2)
    h.memory("host", used_gib=16, at=3, other=8, llm=8.0)
    [dev] = [d for d in h.s.snapshot(3).devices if d.name == HOST]
    # other's 8 GiB and llm's 8.0 GiB, not llm's need at (4096, 1) by the raised line
    assert dev.committed_bytes == 8 * GIB + int(8.0 * GIB)


def test_yard_probe_measures_the_ends_of_the_path() -> None:
    assert path_ends(SPAN, SLOTS) == [(4096, 1), (16384, 1), (16384, 8)]
    assert path_ends(SPAN, None) == [(4096, None), (16384, None)]
    assert path_ends(None, (2, 6)) == [(None, 2), (None, 6)]
    assert path_ends((512, 512), (1, 1)) == [(512, 1)]
    assert path_ends(None, None) == [(None, None)]


@settings(max_examples=300, deadline=None)
# a slope so small that the room it leaves overflows to infinity; one under a byte
@example(base=1, per_token=5e-324, per_slot=5e-324, margin=1.0, free=GIB, gpu=False)
@example(base=1, per_token=1e-300, per_slot=1e9, margin=1.0, free=1, gpu=True)
@given(
    base=st.integers(0, 8 * GIB),
    per_token=st.floats(0, 256 * 1024),
    per_slot=st.floats(0, 2 * GIB),
    margin=st.floats(1.0, 1.5),
    free=st.integers(0, 64 * GIB),
    gpu=st.booleans(),
)
def test_the_choice_fits_and_the_next_step_along_the_path_does_not(
    base: int, per_token: float, per_slot: float, margin: float, free: int, gpu: bool
) -> None:
    gpus = ("gpu0",) if gpu else ()
    line = Profile(
        gpu_bytes=base if gpu else 0,
        host_bytes=base,
        load_s=1,
        context=SPAN[0],
        host_per_token=per_token,
        gpu_per_token=per_token,
        parallel=SLOTS[0],
        host_per_slot=per_slot,
        gpu_per_slot=per_slot,
    )
    room = {HOST: free, **dict.fromkeys(gpus, free)}
    required = need_at(line, gpus, margin, SPAN[0], SLOTS[0])
    if any(n > room[d] for d, n in required.items()):
        return  # placement makes room for the required part first
    choice = choose(spec(gpus=gpus), line, gpus, margin, room)
    assert choice is not None and choice.context is not None and choice.parallel is not None
    assert all(n <= room[d] for d, n in choice.need.items())
    assert choice.need == need_at(line, gpus, margin, choice.context, choice.parallel)
    # on the path: more slots only with the context at its maximum
    assert choice.parallel == SLOTS[0] or choice.context == SPAN[1]
    if choice.context < SPAN[1]:
        bigger = choice.context // STEP * STEP + STEP
        assert any(n > room[d] for d, n in need_at(line, gpus, margin, bigger, 1).items())
    elif choice.parallel < SLOTS[1]:
        more = need_at(line, gpus, margin, SPAN[1], choice.parallel + 1)
        assert any(n > room[d] for d, n in more.items())

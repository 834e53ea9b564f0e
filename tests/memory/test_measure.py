"""measure_profile on virtual time with a fake launcher and meter; the fit report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.memory.fake_proc import FakeProc
from yard.app.probe import fit_report
from yard.core.spec import Profile
from yard.memory import default_meter
from yard.memory.measure import Measurement, measure_profile
from yard.memory.meter import MachineMeter
from yard.memory.readings import DeviceDetail
from yard.ports import BackendStartError, ExitStatus
from yard.testing.gpu import NVML_ERROR_NOT_SUPPORTED, FakeGpu, FakeNvml
from yard.testing.ports import FakeLauncher, FakeMeter, Script

MIB = 1 << 20


def machine(launcher: FakeLauncher) -> FakeMeter:
    meter = FakeMeter({"host": 64 << 30, "gpu0": 80 << 30}, launcher)
    meter.set_foreign("gpu0", 2 << 30)
    return meter


def loading(t: float) -> dict[str, int]:
    """Grows on the meter as it loads: 100 MiB host at once, GPU 1 GiB at 1 s,
    ready at 2 s (1.5 GiB GPU); its warm-up's worst case (2 GiB) for 0.5 s,
    then it settles back to 1.2 GiB."""
    gpu = 0 if t < 1.0 else 1024 if t < 2.0 else 2048 if t < 2.5 else 1200
    return {"host": 100 * MIB, "gpu0": gpu * MIB}


LOADS = Script(ready_after_s=2.0, stop_s=0.0, memory=loading)


async def test_a_first_load_is_measured_through_start_up_and_warm_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = FakeLauncher({"llm": LOADS})
    meter = machine(launcher)
    phases: list[str] = []
    warmed: list[float] = []

    async def warmup(base_url: str) -> None:
        assert base_url == launcher.latest("llm").base_url
        await trio.sleep(0.5)
        warmed.append(trio.current_time())

    def seen(phase: str, details: list[DeviceDetail]) -> None:
        phases.append(phase)

    t0 = trio.current_time()
    m = await measure_profile(
        backend="llm",
        gpus=("gpu0",),
        launcher=launcher,
        meter=meter,
        interval_s=0.2,
        warmup=warmup,
        settle_s=1.0,
        on_sample=seen,
    )
    assert trio.current_time() - t0 == 3.5
    assert launcher.launched == [(t0, "llm", ("gpu0",))]
    process = launcher.latest("llm")
    assert (process.ready_at, warmed) == (t0 + 2.0, [t0 + 2.5])
    assert process.stop_calls == 1
    assert m.load_s == 2.0
    assert m.warmup_s == 0.5
    assert dict(m.peak_bytes) == {"host": 100 * MIB, "gpu0": 2048 * MIB}
    assert dict(m.steady_bytes) == {"host": 100 * MIB, "gpu0": 1200 * MIB}
    assert m.profile() == Profile(gpu_bytes=2048 * MIB, host_bytes=100 * MIB, load_s=m.load_s)
    # The reading before launch shows the device as others left it.
    before = {d.device: d for d in m.before}
    assert before["gpu0"].used_bytes == 2 << 30
    assert phases[0] == "before"
    assert {"loading", "warm-up", "settling"} <= set(phases)
    assert m.samples == 19  # every 200 ms over 3.5 s, plus the last one


async def test_a_failed_start_still_stops_the_process(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script(
        ready_after_s=None,
        fail_after_s=2.0,
        fail_oom=True,
        fail_detail="exited with 1: CUDA error: out of memory",
        stop_s=0.0,
        memory=loading,
    )
    launcher = FakeLauncher({"llm": script})
    with pytest.raises(BackendStartError, match="out of memory"):
        await measure_profile(
            backend="llm", gpus=("gpu0",), launcher=launcher, meter=machine(launcher)
        )
    assert launcher.latest("llm").stop_calls == 1


async def test_the_callers_timeout_stops_the_process(
    autojump_clock: trio.testing.MockClock,
) -> None:
    launcher = FakeLauncher({"llm": LOADS})
    with trio.move_on_after(1.5) as scope:
        await measure_profile(
            backend="llm", gpus=("gpu0",), launcher=launcher, meter=machine(launcher)
        )
    assert scope.cancelled_caught
    assert launcher.latest("llm").stop_calls == 1


def measurement(host: int, gpu: int, before_used: dict[str, int]) -> Measurement:
    before = tuple(
        DeviceDetail(
            device=name,
            kind="host" if name == "host" else "gpu",
            label=name,
            total_bytes=0,
            used_bytes=used,
        )
        for name, used in before_used.items()
    )
    return Measurement(
        backend="llm",
        gpus=("gpu0",),
        load_s=1.0,
        warmup_s=None,
        peak_bytes={"host": host, "gpu0": gpu},
        steady_bytes={"host": host, "gpu0": gpu},
        reclaimable_bytes=0,
        samples=1,
        before=before,
    )


def test_fit_is_peak_times_margin_against_total_reserve_and_the_pinned() -> None:
    m = measurement(1000 * MIB, 10_000 * MIB, {"host": 2000 * MIB, "gpu0": 500 * MIB, "gpu1": 0})
    pinned = {
        "tts": (Profile(gpu_bytes=8000 * MIB, host_bytes=500 * MIB, load_s=1), ("gpu0",)),
        "embed": (Profile(gpu_bytes=1000 * MIB, host_bytes=100 * MIB, load_s=1), ("gpu1",)),
    }
    fits = {
        f.device: f
        for f in fit_report(
            m,
            candidates=("gpu0", "gpu1"),
            totals={"host": 8000 * MIB, "gpu0": 20_000 * MIB, "gpu1": 13_000 * MIB},
            reserves={"host": 1000 * MIB, "gpu0": 500 * MIB},
            pinned=pinned,
            margin=1.1,
        )
    }
    # gpu0: the pinned tts reservation (8800) is more than what was in use (500).
    assert fits["gpu0"].others_bytes == 8800 * MIB
    assert fits["gpu0"].available_bytes == (20_000 - 500 - 8800) * MIB
    assert fits["gpu0"].need_bytes == 11_000 * MIB
    assert not fits["gpu0"].fits
    assert fits["gpu0"].pinned == ("tts",)
    assert fits["gpu1"].others_bytes == 1100 * MIB
    assert fits["gpu1"].fits
    # host: what was in use (2000) is more than the pinned reservations (660).
    assert fits["host"].others_bytes == 2000 * MIB
    assert fits["host"].need_bytes == 1100 * MIB
    assert fits["host"].fits
    assert fits["host"].pinned == ("embed", "tts")


@dataclass
class GpuLoader:
    """A backend (pid 100 in a fake /proc) whose GPU use shows only on the
    device: the driver refuses per-process figures."""

    board: FakeGpu
    name: str = "llm"
    base_url: str = "http://127.0.0.1:9"
    pid: int | None = 100
    stopped: int = 0

    async def wait_ready(self) -> None:
        self.board.used += 300 * MIB  # CUDA context
        await trio.sleep(0.5)
        self.board.used += 4000 * MIB  # weights
        await trio.sleep(0.5)

    async def wait_exit(self) -> ExitStatus:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def stop(self) -> ExitStatus:
        self.stopped += 1
        return ExitStatus(code=0)


@dataclass
class HandsOut:
    """A launcher that hands out the one process the test built (a GPU
    loader drives the fake NVML's board, which the shared fake launcher's
    scripted processes do not)."""

    process: GpuLoader

    async def launch(
        self,
        backend: str,
        gpus: tuple[str, ...],
        *,
        measure: bool = False,
        context: int | None = None,
        parallel: int | None = None,
    ) -> GpuLoader:
        return self.process


@dataclass
class InlineMeter:
    """A :class:`SystemMeter` read in the Trio thread, for tests on virtual time.

    ``SystemMeter.read_details`` samples in a worker thread. Under the autojump
    clock a task waiting for a thread counts as blocked, so the clock jumps to
    the next timer while the thread runs: the sample is taken at some later
    virtual moment, depending on how fast the thread was scheduled (a short
    warm-up peak was missed about half the time, alone or after other tests).
    Sampling inline takes no virtual time, so each sample lands when it is due.
    """

    meter: MachineMeter

    async def read_details(self, pids: Mapping[str, int]) -> list[DeviceDetail]:
        return self.meter.sample(pids)


async def test_without_per_process_figures_a_lone_load_is_measured_by_device_deltas(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, anon_kib=1024)
    board = FakeGpu(used=1 << 30, process_error=NVML_ERROR_NOT_SUPPORTED)  # 1 GiB foreign
    meter = default_meter(nvml=FakeNvml([board]), proc=proc.root)
    process = GpuLoader(board)

    async def worst_case(base_url: str) -> None:
        board.used += 700 * MIB  # compute buffers at full context
        await trio.sleep(0.4)
        board.used -= 200 * MIB

    m = await measure_profile(
        backend="llm",
        gpus=("gpu0",),
        launcher=HandsOut(process),
        meter=InlineMeter(meter),
        warmup=worst_case,
        settle_s=0.4,
    )
    assert m.peak_bytes["gpu0"] == 5000 * MIB
    assert m.steady_bytes["gpu0"] == 4800 * MIB
    assert m.attribution["gpu0"] == "device-delta"
    assert m.peak_bytes["host"] == 1024 * 1024
    assert any("not supported" in note for note in m.notes)
    assert process.stopped == 1

"""The NVML meter against a fake pynvml and a fake /proc, traps included."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from tests.memory.fake_proc import FakeProc
from yard.memory import NvmlMeter, NvmlUnavailable, default_meter, open_nvml
from yard.memory.readings import DeviceDetail
from yard.testing.gpu import (
    GIB,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    FakeGpu,
    FakeNvml,
    ProcessInfo,
    SharedGpu,
)

MIB = 1 << 20


def meter(nvml: FakeNvml, proc: FakeProc) -> NvmlMeter:
    return NvmlMeter(open_nvml(nvml), proc=proc.root)


def gpu(details: list[DeviceDetail], name: str = "gpu0") -> DeviceDetail:
    return next(d for d in details if d.device == name)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc")
    fake.add(100, anon_kib=1000)  # backend root
    fake.add(101, ppid=100)  # its worker
    fake.add(200)  # somebody else's process
    return fake


def test_per_process_memory_is_summed_over_the_backend_tree(proc: FakeProc) -> None:
    board = FakeGpu(
        used=5 * GIB,
        compute=[ProcessInfo(100, 1 * GIB), ProcessInfo(101, GIB // 2), ProcessInfo(200, 2 * GIB)],
    )
    detail = gpu(meter(FakeNvml([board]), proc).sample({"llm": 100}))
    assert detail.attribution == "per-process"
    assert detail.backends["llm"].held_bytes == 3 * GIB // 2
    assert detail.backends["llm"].pids == (100, 101)
    # Foreign: everything the device uses that the backend does not hold.
    assert detail.foreign_bytes == 5 * GIB - 3 * GIB // 2
    assert detail.reading().backends == {"llm": 3 * GIB // 2}


def test_a_card_shared_by_processes_is_metered_as_a_board_is(
    tmp_path: Path, proc: FakeProc
) -> None:
    card = SharedGpu.create(
        tmp_path / "gpu0.json",
        total_bytes=24 * GIB,
        foreign_bytes=2 * GIB,
        reserved_bytes=256 * MIB,
    )
    me = os.getpid()
    proc.add(me, anon_kib=1000)
    card.allocate(me, 3 * GIB)
    exited = subprocess.Popen(["true"])
    exited.wait()
    card.allocate(exited.pid, GIB)  # the driver frees it: it is gone from the next read
    nvml = FakeNvml([card])
    m = meter(nvml, proc)
    detail = gpu(m.sample({"llm": me}))
    assert detail.attribution == "per-process"
    assert detail.total_bytes == 24 * GIB - 256 * MIB
    assert detail.used_bytes == 5 * GIB
    assert detail.backends["llm"].held_bytes == 3 * GIB
    assert detail.foreign_bytes == 2 * GIB
    m.close()
    with pytest.raises(nvml.NVMLError) as refused:
        nvml.nvmlDeviceGetMemoryInfo(card)
    assert refused.value.value == NVML_ERROR_UNINITIALIZED


def test_capacity_excludes_the_driver_reserve(proc: FakeProc) -> None:
    board = FakeGpu(total=80 * GIB, reserved=512 * MIB, used=10 * GIB)
    m = meter(FakeNvml([board]), proc)
    assert m.device_totals() == {"gpu0": 80 * GIB - 512 * MIB}
    detail = gpu(m.sample({}))
    assert (detail.total_bytes, detail.used_bytes, detail.reserved_bytes) == (
        80 * GIB - 512 * MIB,
        10 * GIB,
        512 * MIB,
    )
    assert detail.free_bytes == 70 * GIB - 512 * MIB


def test_gpus_are_named_by_nvml_index_and_credited_separately(proc: FakeProc) -> None:
    boards = [
        FakeGpu(used=GIB, compute=[ProcessInfo(200, GIB)]),
        FakeGpu(used=3 * GIB, compute=[ProcessInfo(101, 3 * GIB)]),
    ]
    details = meter(FakeNvml(boards), proc).sample({"llm": 100})
    assert [d.device for d in details] == ["gpu0", "gpu1"]
    assert gpu(details, "gpu0").backends["llm"].held_bytes == 0
    assert gpu(details, "gpu1").backends["llm"].held_bytes == 3 * GIB


def test_a_process_in_both_lists_counts_once(proc: FakeProc) -> None:
    board = FakeGpu(
        used=2 * GIB,
        compute=[ProcessInfo(100, 2 * GIB)],
        graphics=[ProcessInfo(100, 2 * GIB)],
    )
    assert gpu(meter(FakeNvml([board]), proc).sample({"llm": 100})).backends["llm"].held_bytes == (
        2 * GIB
    )


def test_old_driver_without_v3_lists_falls_back_to_v2(proc: FakeProc) -> None:
    nvml = FakeNvml([FakeGpu(used=GIB, compute=[ProcessInfo(100, GIB)])], has_v3=False)
    detail = gpu(meter(nvml, proc).sample({"llm": 100}))
    assert detail.backends["llm"].held_bytes == GIB
    assert "compute_v2" in nvml.calls


def test_old_driver_without_v2_memory_info_reports_the_reserve_as_used(proc: FakeProc) -> None:
    board = FakeGpu(total=16 * GIB, reserved=256 * MIB, used=GIB)
    detail = gpu(meter(FakeNvml([board], has_memory_v2=False), proc).sample({}))
    assert (detail.total_bytes, detail.used_bytes, detail.reserved_bytes) == (
        16 * GIB,
        GIB + 256 * MIB,
        0,
    )


def test_pids_are_mapped_through_nspid_when_yard_runs_in_a_pid_namespace(
    tmp_path: Path,
) -> None:
    # /proc shows the outer namespace; yard is pid 7 in its own. The backend
    # yard started as pid 12 is 5012 outside, its worker 13 is 5013.
    proc = FakeProc(tmp_path / "proc", self_nspid=(5007, 7))
    proc.add(5007, nspid=(5007, 7))
    proc.add(5012, ppid=5007, nspid=(5012, 12), anon_kib=2048)
    proc.add(5013, ppid=5012, nspid=(5013, 13), anon_kib=1024)
    proc.add(12, anon_kib=999_999)  # an unrelated outer process that happens to be 12
    board = FakeGpu(used=3 * GIB, compute=[ProcessInfo(5012, GIB), ProcessInfo(5013, 2 * GIB)])
    nvml = FakeNvml([board])
    detail = gpu(meter(nvml, proc).sample({"llm": 12}))
    assert detail.attribution == "per-process"
    assert detail.backends["llm"].held_bytes == 3 * GIB

    host = default_meter(nvml=FakeNvml([board]), proc=proc.root).sample({"llm": 12})
    assert host[0].device == "host"
    assert host[0].backends["llm"].held_bytes == 3072 * 1024
    assert host[0].backends["llm"].pids == (5012, 5013)


def _delta_walk(nvml: FakeNvml, proc: FakeProc) -> list[DeviceDetail]:
    """Foreign 1 GiB; llm loads to 4 GiB; tts loads alongside (+2 GiB);
    llm stops. Returns each step's gpu0 detail."""
    proc.add(300)
    board = nvml.gpus[0]
    assert isinstance(board, FakeGpu)  # a board in memory, whose figures we set
    m = meter(nvml, proc)
    steps = []
    board.used = GIB
    steps.append(gpu(m.sample({})))
    board.used = GIB + 200 * MIB  # the CUDA context appears
    steps.append(gpu(m.sample({"llm": 100})))
    board.used = 4 * GIB
    steps.append(gpu(m.sample({"llm": 100})))
    board.used = 6 * GIB
    steps.append(gpu(m.sample({"llm": 100, "tts": 300})))
    # The engine may read one backend alone (waiting for a stopped one's
    # memory to go): the others have not left.
    steps.append(gpu(m.sample({"tts": 300})))
    proc.remove(100)
    board.used = 3 * GIB
    steps.append(gpu(m.sample({"llm": 100, "tts": 300})))
    return steps


@pytest.mark.parametrize(
    ("code", "why"),
    [(NVML_ERROR_NOT_SUPPORTED, "not supported"), (NVML_ERROR_NO_PERMISSION, "MIG")],
)
def test_refused_process_lists_fall_back_to_device_deltas(
    proc: FakeProc, code: int, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    board = FakeGpu(process_error=code)
    with caplog.at_level(logging.WARNING):
        steps = _delta_walk(FakeNvml([board]), proc)
    assert [s.attribution for s in steps] == ["none"] + ["device-delta"] * 5
    assert why in steps[1].note
    assert steps[1].backends["llm"].held_bytes == 200 * MIB
    assert steps[2].backends["llm"].held_bytes == 3 * GIB
    # tts arrived: llm keeps its figure from just before, tts gets the growth.
    assert steps[3].backends["llm"].held_bytes == 3 * GIB
    assert steps[3].backends["tts"].held_bytes == 2 * GIB
    assert dict(steps[4].reading().backends) == {"tts": 2 * GIB}
    # llm exited: tts keeps its figure, and the foreign gigabyte is still foreign.
    assert dict(steps[5].reading().backends) == {"llm": 0, "tts": 2 * GIB}
    assert steps[5].foreign_bytes == GIB
    assert sum(why in r.getMessage() for r in caplog.records) == 1  # said once


def test_unavailable_per_process_figures_fall_back_to_device_deltas(proc: FakeProc) -> None:
    board = FakeGpu(compute=[ProcessInfo(100, None)])
    steps = _delta_walk(FakeNvml([board]), proc)
    assert steps[2].attribution == "device-delta"
    assert steps[2].backends["llm"].held_bytes == 3 * GIB
    assert "not available" in steps[2].note


def test_a_figure_above_the_device_total_is_garbage_and_stays_distrusted(
    proc: FakeProc,
) -> None:
    board = FakeGpu(used=GIB, compute=[ProcessInfo(100, 2**63)])
    m = meter(FakeNvml([board]), proc)
    first = gpu(m.sample({"llm": 100}))
    assert first.attribution == "device-delta"
    assert "implausible" in first.note
    # Sane-looking figures later do not switch back: a mismatched pairing
    # stays mismatched, and figures must not jump between methods.
    board.compute = [ProcessInfo(100, GIB)]
    board.used = 2 * GIB
    second = gpu(m.sample({"llm": 100}))
    assert second.attribution == "device-delta"
    assert second.backends["llm"].held_bytes == 0 + GIB  # growth since it was first seen


def test_a_sum_above_what_the_device_uses_is_garbage(proc: FakeProc) -> None:
    board = FakeGpu(used=GIB, compute=[ProcessInfo(100, 3 * GIB), ProcessInfo(200, 3 * GIB)])
    assert gpu(meter(FakeNvml([board]), proc).sample({"llm": 100})).attribution == ("device-delta")


def test_impossible_pids_are_garbage(proc: FakeProc) -> None:
    board = FakeGpu(used=GIB, compute=[ProcessInfo(0, GIB // 2), ProcessInfo(1 << 31, 1)])
    detail = gpu(meter(FakeNvml([board]), proc).sample({}))
    assert "implausible" in detail.note


def test_hidden_pids_force_deltas_only_when_a_backend_matched_nothing(proc: FakeProc) -> None:
    # NVML lists pid 9999, which this /proc cannot see (another namespace).
    hidden = FakeGpu(used=2 * GIB, compute=[ProcessInfo(9999, 2 * GIB)])
    detail = gpu(meter(FakeNvml([hidden]), proc).sample({"llm": 100}))
    assert detail.attribution == "device-delta"
    assert "pid namespace" in detail.note
    # Our backend is matched: the hidden pid is just somebody else.
    seen = FakeGpu(used=3 * GIB, compute=[ProcessInfo(9999, 2 * GIB), ProcessInfo(100, GIB)])
    detail = gpu(meter(FakeNvml([seen]), proc).sample({"llm": 100}))
    assert detail.attribution == "per-process"
    assert detail.backends["llm"].held_bytes == GIB
    assert detail.foreign_bytes == 2 * GIB


def test_entering_the_fallback_keeps_the_last_per_process_figures(proc: FakeProc) -> None:
    board = FakeGpu(used=3 * GIB, compute=[ProcessInfo(100, 2 * GIB)])
    m = meter(FakeNvml([board]), proc)
    assert gpu(m.sample({"llm": 100})).backends["llm"].held_bytes == 2 * GIB
    board.process_error = NVML_ERROR_NO_PERMISSION
    detail = gpu(m.sample({"llm": 100}))
    assert detail.attribution == "device-delta"
    assert detail.backends["llm"].held_bytes == 2 * GIB
    assert detail.foreign_bytes == GIB


def test_cuda_visible_devices_keeps_delta_credit_off_other_gpus(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, environ={"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    boards = [
        FakeGpu(process_error=NVML_ERROR_NOT_SUPPORTED, uuid="GPU-aaaa"),
        FakeGpu(process_error=NVML_ERROR_NOT_SUPPORTED, uuid="GPU-bbbb"),
    ]
    m = meter(FakeNvml(boards), proc)
    m.sample({})
    boards[0].used = GIB  # somebody else grows on gpu0 meanwhile
    boards[1].used = 2 * GIB
    details = m.sample({"llm": 100})
    assert "llm" not in gpu(details, "gpu0").backends
    assert gpu(details, "gpu0").foreign_bytes == GIB
    assert gpu(details, "gpu1").backends["llm"].held_bytes == 2 * GIB

    proc.add(100, environ={"CUDA_VISIBLE_DEVICES": "GPU-bbbb"})
    m2 = meter(FakeNvml(boards), proc)
    assert "llm" not in gpu(m2.sample({"llm": 100}), "gpu0").backends


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "not installed"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
    ],
)
def test_no_driver_means_host_only_mode_said_once(
    tmp_path: Path, code: int, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(NvmlUnavailable, match=why):
        open_nvml(FakeNvml(init_error=code))
    proc = FakeProc(tmp_path / "proc")
    with caplog.at_level(logging.WARNING):
        m = default_meter(nvml=FakeNvml(init_error=code), proc=proc.root)
    assert m.mode == "host-only"
    assert why in m.mode_detail
    assert list(m.device_totals()) == ["host"]
    assert [d.device for d in m.sample({})] == ["host"]
    assert sum("host-only" in r.getMessage() for r in caplog.records) == 1


def test_no_gpu_at_all_is_host_only(tmp_path: Path) -> None:
    m = default_meter(nvml=FakeNvml([]), proc=FakeProc(tmp_path / "proc").root)
    assert m.mode == "host-only"
    assert "no GPU" in m.mode_detail


def test_default_meter_with_gpus_reads_host_and_gpus(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeGpu(name="NVIDIA H200")])
    m = default_meter(nvml=nvml, proc=FakeProc(tmp_path / "proc").root)
    assert m.mode == "nvml"
    assert "gpu0 (NVIDIA H200, 79.5 GiB)" in m.mode_detail
    assert set(m.device_totals()) == {"host", "gpu0"}
    m.close()
    assert nvml.initialised == 0


async def test_read_returns_engine_readings(proc: FakeProc) -> None:
    board = FakeGpu(used=2 * GIB, compute=[ProcessInfo(100, GIB)])
    m = default_meter(nvml=FakeNvml([board]), proc=proc.root)
    readings = {r.device: r for r in await m.read({"llm": 100})}
    assert readings["gpu0"].backends == {"llm": GIB}
    assert readings["gpu0"].used_bytes == 2 * GIB
    assert readings["host"].backends == {"llm": 1000 * 1024}


def test_the_real_pynvml_without_a_driver_gives_host_only() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver; scripts/nvml_check.py covers it")
    m = default_meter()
    assert m.mode == "host-only"
    assert list(m.device_totals()) == ["host"]

"""The DRM meter (AMD, Intel) on recorded fdinfo shapes and a fake sysfs,
traps included: clients shared across processes and fds, missing keys, old
kernels with only drm-memory-*, a driver without VRAM totals.

Every figure is checked against the ground truth the fixture was built from
(the target is within 1 %; these readers are exact on them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.memory.fake_drm import GIB, KIB, MIB, FakeDrm, fdinfo
from yard.memory import default_meter
from yard.memory.drm import (
    DrmMeter,
    client_memory,
    layout_for,
    parse_fdinfo,
    parse_size,
    scan_cards,
)
from yard.memory.gpus import recorded_layout, visible_devices_env
from yard.memory.readings import DeviceDetail
from yard.testing.gpu import FakeGpu, FakeNvml

AMD_SLOT = "0000:03:00.0"
XE_SLOT = "0000:04:00.0"
IGPU_SLOT = "0000:00:02.0"


def device(details: list[DeviceDetail], name: str) -> DeviceDetail:
    return next(d for d in details if d.device == name)


def within_1_percent(measured: int, truth: int) -> bool:
    return abs(measured - truth) <= truth / 100


def amd_machine(tmp_path: Path, *, vram_used: int | None = 20 * GIB) -> FakeDrm:
    fake = FakeDrm(tmp_path)
    fake.card(
        1,
        slot=AMD_SLOT,
        driver="amdgpu",
        pci_id="1002:744C",
        render=128,
        vram_total=24 * GIB,
        vram_used=vram_used,
        unique_id="f980f88ef31631a2",
    )
    return fake


def drm_meter(fake: FakeDrm) -> DrmMeter:
    cards = scan_cards(sys_root=fake.sys)
    layout = layout_for(cards, first_index=0)
    return DrmMeter(cards, layout.places, proc=fake.proc.root, sys_root=fake.sys)


# -- parsing ------------------------------------------------------------------


def test_sizes_carry_the_units_the_kernel_prints() -> None:
    assert parse_size("0") == 0
    assert parse_size("4096") == 4096  # a bare number is bytes
    assert parse_size("23992 KiB") == 23992 * KIB
    assert parse_size("16 MiB") == 16 * MIB
    assert parse_size("2 GiB") == 2 * GIB
    assert parse_size("12 furlongs") is None
    assert parse_size("") is None


def test_resident_vram_is_what_a_new_amdgpu_client_holds() -> None:
    text = fdinfo(
        "amdgpu-6.12",
        client=93,
        pdev=AMD_SLOT,
        pasid=32791,
        total_kib=4325376,
        resident_kib=4194304,
        evicted_kib=131072,
    )
    client = client_memory(parse_fdinfo(text), pdev=AMD_SLOT, fallback_key="fd")
    # 128 MiB of its VRAM buffers were evicted: resident is what the device holds.
    assert client.local_bytes == 4 * GIB
    assert client.source == "resident"
    assert client.key == "client 93"


def test_an_old_kernel_with_only_drm_memory_keys_is_read() -> None:
    text = fdinfo("amdgpu-5.19", client=12, pdev=AMD_SLOT, pasid=32770, vram_kib=2097152)
    client = client_memory(parse_fdinfo(text), pdev=AMD_SLOT, fallback_key="fd")
    assert client.local_bytes == 2 * GIB  # gtt and cpu are host memory, not counted
    assert client.source == "memory"


def test_xe_vram_regions_are_device_local_and_system_ones_are_not() -> None:
    client = client_memory(
        parse_fdinfo(fdinfo("xe", client=3, pdev=XE_SLOT, vram_mib=1500)),
        pdev=XE_SLOT,
        fallback_key="fd",
    )
    assert client.local_bytes == 1500 * MIB


def test_a_client_with_only_totals_counts_its_totals() -> None:
    fields = {"drm-driver": "xe", "drm-client-id": "5", "drm-total-vram0": "64 MiB"}
    client = client_memory(fields, pdev=XE_SLOT, fallback_key="fd")
    assert (client.local_bytes, client.source) == (64 * MIB, "total")


def test_missing_memory_keys_mean_nothing_held() -> None:
    fields = {"drm-driver": "amdgpu", "drm-client-id": "7", "drm-engine-gfx": "5 ns"}
    client = client_memory(fields, pdev=AMD_SLOT, fallback_key="fd")
    assert (client.local_bytes, client.source) == (0, "none")


# -- sysfs --------------------------------------------------------------------


def test_cards_are_found_with_their_totals_and_why_some_are_not_metered(tmp_path: Path) -> None:
    fake = amd_machine(tmp_path)
    fake.card(0, slot=IGPU_SLOT, driver="i915", pci_id="8086:46A6")
    fake.card(2, slot=XE_SLOT, driver="xe", pci_id="8086:56A0", xe_tiles=(16 * GIB,))
    cards = {c.card: c for c in scan_cards(sys_root=fake.sys)}
    assert set(cards) == {"card0", "card1", "card2"}  # connectors are not cards
    assert cards["card1"].vendor == "amd"
    assert cards["card1"].total_bytes == 24 * GIB
    assert cards["card1"].uuid == "GPU-f980f88ef31631a2"
    assert cards["card2"].total_bytes == 16 * GIB
    assert cards["card0"].total_bytes is None
    assert "i915" in cards["card0"].why_unmetered


def test_an_amdgpu_without_vram_total_is_not_metered(tmp_path: Path) -> None:
    fake = FakeDrm(tmp_path)
    fake.card(1, slot=AMD_SLOT, driver="amdgpu", pci_id="1002:744C")
    (card,) = scan_cards(sys_root=fake.sys)
    assert card.total_bytes is None
    assert "mem_info_vram_total" in card.why_unmetered


# -- attribution ----------------------------------------------------------------


def test_clients_are_summed_per_backend_and_shared_ones_count_once(tmp_path: Path) -> None:
    fake = amd_machine(tmp_path)
    proc = fake.proc
    proc.add(100)  # backend "llm": a server ...
    proc.add(101, ppid=100)  # ... and its forked worker, sharing the same client
    proc.add(200)  # backend "tts": two clients of its own
    proc.add(300)  # the desktop, not ours
    llm = fdinfo(
        "amdgpu-6.12",
        client=41,
        pdev=AMD_SLOT,
        pasid=1,
        total_kib=4194304,
        resident_kib=4194304,
        evicted_kib=0,
    )
    fake.open(100, 5, llm)
    fake.open(100, 9, llm)  # a dup of the same fd
    fake.open(101, 5, llm)  # inherited over fork
    fake.open_file(100, 3, "/var/log/llm.log")
    fake.open(200, 5, fdinfo("amdgpu-5.19", client=42, pdev=AMD_SLOT, pasid=2, vram_kib=2097152))
    fake.open(200, 6, fdinfo("amdgpu-5.19", client=43, pdev=AMD_SLOT, pasid=3, vram_kib=524288))
    fake.open(300, 5, fdinfo("amdgpu-5.19", client=44, pdev=AMD_SLOT, pasid=4, vram_kib=1048576))
    truth = {"llm": 4 * GIB, "tts": 2 * GIB + 512 * MIB}

    trees = {"llm": [100, 101], "tts": [200]}
    (gpu,) = drm_meter(fake).sample({"llm": 100, "tts": 200}, trees=trees)

    assert gpu.device == "gpu0"
    assert gpu.total_bytes == 24 * GIB
    assert gpu.used_bytes == 20 * GIB  # the driver's own figure, everybody included
    assert gpu.attribution == "per-process"
    for backend, expected in truth.items():
        assert within_1_percent(gpu.backends[backend].held_bytes, expected)
        assert gpu.backends[backend].held_bytes == expected
    assert gpu.backends["llm"].pids == (100,)
    assert gpu.foreign_bytes == 20 * GIB - sum(truth.values())
    assert gpu.note == ""


def test_a_client_in_two_backends_trees_counts_for_the_first_only(tmp_path: Path) -> None:
    fake = amd_machine(tmp_path)
    fake.proc.add(100)
    fake.proc.add(200)
    shared = fdinfo("amdgpu-5.19", client=50, pdev=AMD_SLOT, pasid=9, vram_kib=1048576)
    fake.open(100, 5, shared)
    fake.open(200, 5, shared)  # handed over a unix socket, say
    (gpu,) = drm_meter(fake).sample({"a": 100, "b": 200}, trees={"a": [100], "b": [200]})
    assert gpu.backends["a"].held_bytes == GIB
    assert gpu.backends["b"].held_bytes == 0


def test_without_drm_pdev_the_device_is_found_from_the_fd(tmp_path: Path) -> None:
    fake = amd_machine(tmp_path)
    fake.proc.add(100)
    text = fdinfo("amdgpu-5.19", client=12, pdev=AMD_SLOT, pasid=5, vram_kib=1048576)
    text = "".join(line + "\n" for line in text.splitlines() if not line.startswith("drm-pdev"))
    fake.open(100, 5, text, node="renderD128")
    (gpu,) = drm_meter(fake).sample({"llm": 100})
    assert gpu.backends["llm"].held_bytes == GIB


def test_without_client_ids_pasid_tells_clients_apart_else_each_fd_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = amd_machine(tmp_path)
    fake.proc.add(100)
    fake.proc.add(101, ppid=100)
    with_pasid = {"drm-driver": "amdgpu", "drm-pdev": AMD_SLOT, "pasid": "77"}
    fake.open(100, 5, _text(with_pasid | {"drm-memory-vram": "1048576 KiB"}))
    fake.open(101, 5, _text(with_pasid | {"drm-memory-vram": "1048576 KiB"}))  # same client
    (gpu,) = drm_meter(fake).sample({"llm": 100}, trees={"llm": [100, 101]})
    assert gpu.backends["llm"].held_bytes == GIB
    assert gpu.note == ""

    bare = {"drm-driver": "amdgpu", "drm-pdev": AMD_SLOT, "drm-memory-vram": "524288 KiB"}
    fake.open(100, 6, _text(bare))
    with caplog.at_level(logging.WARNING):
        (gpu,) = drm_meter(fake).sample({"llm": 100}, trees={"llm": [100, 101]})
    assert gpu.backends["llm"].held_bytes == GIB + 512 * MIB
    assert "drm-client-id" in gpu.note
    assert "drm-client-id" in caplog.text


def test_a_backend_that_exited_holds_nothing(tmp_path: Path) -> None:
    fake = amd_machine(tmp_path)
    (gpu,) = drm_meter(fake).sample({"gone": 999}, trees={"gone": []})
    assert gpu.backends["gone"].held_bytes == 0


def test_xe_has_no_vram_use_in_sysfs_so_use_is_the_sum_of_readable_clients(
    tmp_path: Path,
) -> None:
    fake = FakeDrm(tmp_path)
    fake.card(0, slot=IGPU_SLOT, driver="i915", pci_id="8086:46A6", render=128)
    fake.card(1, slot=XE_SLOT, driver="xe", pci_id="8086:56A0", render=129, xe_tiles=(16 * GIB,))
    fake.proc.add(100)
    fake.proc.add(300)  # a game, not ours
    fake.open(100, 5, fdinfo("xe", client=3, pdev=XE_SLOT, vram_mib=6000), node="renderD129")
    fake.open(300, 5, fdinfo("xe", client=4, pdev=XE_SLOT, vram_mib=2000), node="renderD129")
    fake.open(300, 6, fdinfo("i915-igpu", client=1, pdev=IGPU_SLOT))
    meter = drm_meter(fake)
    assert meter.device_totals() == {"gpu0": 16 * GIB}  # the iGPU is not metered
    (gpu,) = meter.sample({"llm": 100})
    assert gpu.backends["llm"].held_bytes == 6000 * MIB
    assert gpu.used_bytes == 8000 * MIB
    assert "no memory use" in gpu.note


# -- amdsmi -------------------------------------------------------------------


class FakeAmdsmi:
    """The part of AMD's ``amdsmi`` the meter uses."""

    AmdSmiMemoryType = SimpleNamespace(VRAM="vram")

    def __init__(self, *, total: int, used: int) -> None:
        self.total = total
        self.used = used
        self.shut = False

    def amdsmi_init(self) -> None:
        pass

    def amdsmi_shut_down(self) -> None:
        self.shut = True

    def amdsmi_get_processor_handles(self) -> list[str]:
        return ["h0"]

    def amdsmi_get_gpu_device_bdf(self, handle: str) -> str:
        return AMD_SLOT.upper()

    def amdsmi_get_gpu_memory_total(self, handle: str, kind: str) -> int:
        return self.total

    def amdsmi_get_gpu_memory_usage(self, handle: str, kind: str) -> int:
        return self.used

    def amdsmi_get_gpu_asic_info(self, handle: str) -> dict[str, Any]:
        return {"market_name": "Radeon RX 7900 XTX"}


def test_amdsmi_gives_names_and_figures_where_installed(tmp_path: Path) -> None:
    fake = amd_machine(tmp_path, vram_used=None)
    fake.proc.add(100)
    amdsmi = FakeAmdsmi(total=24 * GIB - 64 * MIB, used=3 * GIB)
    meter = default_meter(nvml=FakeNvml([]), proc=fake.proc.root, sys_root=fake.sys, amdsmi=amdsmi)
    assert meter.mode == "drm"
    assert "gpu0 (Radeon RX 7900 XTX, amdgpu, 23.9 GiB)" in meter.mode_detail
    gpu = device(meter.sample({"llm": 100}), "gpu0")
    assert (gpu.total_bytes, gpu.used_bytes) == (24 * GIB - 64 * MIB, 3 * GIB)
    meter.close()
    assert amdsmi.shut


# -- the machine ----------------------------------------------------------------


def mixed_machine(tmp_path: Path) -> FakeDrm:
    """Two NVIDIA GPUs, an AMD one, an Intel iGPU and an Intel Arc on xe."""
    fake = amd_machine(tmp_path)
    fake.card(0, slot=IGPU_SLOT, driver="i915", pci_id="8086:46A6")
    fake.card(2, slot=XE_SLOT, driver="xe", pci_id="8086:56A0", xe_tiles=(16 * GIB,))
    fake.card(3, slot="0000:01:00.0", driver="nvidia", pci_id="10de:2335")
    return fake


def test_nvidia_is_named_first_then_the_others_in_pci_order(tmp_path: Path) -> None:
    fake = mixed_machine(tmp_path)
    nvml = FakeNvml([FakeGpu(), FakeGpu()])
    meter = default_meter(nvml=nvml, proc=fake.proc.root, sys_root=fake.sys, amdsmi=False)
    assert meter.mode == "nvml+drm"
    assert set(meter.device_totals()) == {"host", "gpu0", "gpu1", "gpu2", "gpu3"}
    assert meter.device_totals()["gpu2"] == 24 * GIB  # AMD
    assert meter.device_totals()["gpu3"] == 16 * GIB  # Intel Arc
    assert "through NVML: gpu0" in meter.mode_detail
    assert "through the kernel's DRM interface (fdinfo, sysfs): gpu2" in meter.mode_detail
    assert "not metered: card0" in meter.mode_detail
    layout = recorded_layout()
    assert layout is not None
    arc = layout.place("gpu3")
    assert arc is not None and (arc.vendor, arc.index) == ("intel", 1)  # the iGPU is Level Zero 0


def test_each_vendor_sees_only_the_gpus_a_backend_was_placed_on(tmp_path: Path) -> None:
    fake = mixed_machine(tmp_path)
    default_meter(
        nvml=FakeNvml([FakeGpu(), FakeGpu()]),
        proc=fake.proc.root,
        sys_root=fake.sys,
        amdsmi=False,
    )
    assert visible_devices_env(("gpu1",)) == {
        "YARD_GPUS": "gpu1",
        "CUDA_VISIBLE_DEVICES": "1",
        "ROCR_VISIBLE_DEVICES": "",
        "HIP_VISIBLE_DEVICES": "-1",
        "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1",
        "ZE_AFFINITY_MASK": "2",  # past the last Intel device: none
    }
    amd = visible_devices_env(("gpu2",))
    assert amd["CUDA_VISIBLE_DEVICES"] == ""
    assert amd["ROCR_VISIBLE_DEVICES"] == "GPU-f980f88ef31631a2"
    # HIP reads CUDA_VISIBLE_DEVICES when its own is unset: name all ROCr shows.
    assert amd["HIP_VISIBLE_DEVICES"] == "0"
    assert visible_devices_env(("gpu3",))["ZE_AFFINITY_MASK"] == "1"
    cpu = visible_devices_env(())
    assert cpu["YARD_GPUS"] == "" and cpu["CUDA_VISIBLE_DEVICES"] == ""


def test_without_a_recorded_layout_gpus_are_cuda_devices() -> None:
    from yard.memory.gpus import record_layout

    record_layout(None)
    assert visible_devices_env(("gpu0", "gpu2")) == {
        "YARD_GPUS": "gpu0,gpu2",
        "CUDA_VISIBLE_DEVICES": "0,2",
    }


def test_a_machine_with_only_an_igpu_is_host_only_and_says_why(tmp_path: Path) -> None:
    fake = FakeDrm(tmp_path)
    fake.card(0, slot=IGPU_SLOT, driver="i915", pci_id="8086:46A6")
    meter = default_meter(nvml=FakeNvml([]), proc=fake.proc.root, sys_root=fake.sys)
    assert meter.mode == "host-only"
    assert "NVML sees no GPU" in meter.mode_detail
    assert "not metered: card0" in meter.mode_detail
    assert "i915 reports no local-memory size" in meter.mode_detail
    # No backend can be placed on it, so none is shown it.
    assert visible_devices_env(())["ZE_AFFINITY_MASK"] == "1"


def test_the_system_meter_reads_drm_backends_through_their_process_trees(
    tmp_path: Path,
) -> None:
    fake = amd_machine(tmp_path)
    fake.proc.add(100, anon_kib=1000)
    fake.proc.add(101, ppid=100)
    fake.open(101, 5, fdinfo("amdgpu-5.19", client=8, pdev=AMD_SLOT, pasid=1, vram_kib=3145728))
    meter = default_meter(nvml=FakeNvml([]), proc=fake.proc.root, sys_root=fake.sys)
    details = meter.sample({"llm": 100})
    assert device(details, "gpu0").backends["llm"].held_bytes == 3 * GIB
    assert device(details, "gpu0").backends["llm"].pids == (101,)
    # Its 4 MiB of GTT are host RAM the driver pinned, in no resident set.
    host = device(details, "host").backends["llm"]
    assert host.held_bytes == 1000 * KIB + 4096 * KIB
    assert host.driver_bytes == 4096 * KIB


def test_gtt_and_system_regions_count_on_the_host_not_the_gpu(tmp_path: Path) -> None:
    """An APU's model lives in GTT; an iGPU's buffers in system memory: RAM
    that no process's resident set shows. The host meter alone misses it."""
    fake = amd_machine(tmp_path)
    fake.card(0, slot=IGPU_SLOT, driver="i915", pci_id="8086:46A6")
    fake.proc.add(100, anon_kib=2000)
    apu_like = {
        "drm-driver": "amdgpu",
        "drm-client-id": "61",
        "drm-pdev": AMD_SLOT,
        "drm-resident-vram": "512 MiB",
        "drm-resident-gtt": "30 GiB",
        "drm-resident-cpu": "0",
    }
    fake.open(100, 5, _text(apu_like))
    fake.open(100, 6, fdinfo("i915-igpu", client=2, pdev=IGPU_SLOT))  # 6044 KiB, unmetered card
    meter = default_meter(nvml=FakeNvml([]), proc=fake.proc.root, sys_root=fake.sys)
    details = meter.sample({"llm": 100})
    assert device(details, "gpu0").backends["llm"].held_bytes == 512 * MIB
    host = device(details, "host").backends["llm"]
    assert host.driver_bytes == 30 * GIB + 6044 * KIB
    assert host.held_bytes == 2000 * KIB + 30 * GIB + 6044 * KIB


def _text(fields: dict[str, str]) -> str:
    return "pos:\t0\nflags:\t02100002\n" + "".join(f"{k}:\t{v}\n" for k, v in fields.items())

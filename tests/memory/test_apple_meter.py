"""The Apple silicon meter on a fake macOS source."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from yard.memory import default_meter
from yard.memory.apple import (
    AppleMeter,
    AppleUnavailable,
    Footprint,
    LibprocSource,
    default_gpu_limit,
)
from yard.memory.gpus import recorded_layout, visible_devices_env
from yard.memory.readings import DeviceDetail

MIB = 1 << 20
GIB = 1 << 30


@dataclass
class FakeMac:
    """A Mac: RAM, the GPU limit's sources, and processes with footprints."""

    ram: int = 64 * GIB
    free: int = 40 * GIB
    wired_limit_mb: int = 0
    metal: int | None = None
    children: dict[int, list[int]] = field(default_factory=dict)
    footprints: dict[int, Footprint] = field(default_factory=dict)
    environs: dict[int, dict[str, str]] = field(default_factory=dict)
    apple_silicon: bool = True

    def add(
        self,
        pid: int,
        *,
        phys: int,
        resident: int,
        parent: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.footprints[pid] = Footprint(phys_bytes=phys, resident_bytes=resident)
        self.environs[pid] = env or {}
        if parent is not None:
            self.children.setdefault(parent, []).append(pid)

    def unified_gpu(self) -> bool:
        return self.apple_silicon

    def chip(self) -> str:
        return "Apple M2 Max" if self.apple_silicon else "Intel(R) Core(TM) i9-9880H"

    def memsize(self) -> int:
        return self.ram

    def available(self) -> int:
        return self.free

    def wired_limit(self) -> int:
        return self.wired_limit_mb * MIB

    def metal_working_set(self) -> int | None:
        return self.metal

    def tree(self, pid: int) -> list[int]:
        if pid not in self.footprints:
            return []
        found = [pid]
        for pid_ in found:
            found.extend(self.children.get(pid_, []))
        return found

    def footprint(self, pid: int) -> Footprint | None:
        return self.footprints.get(pid)

    def environ(self, pid: int) -> dict[str, str] | None:
        return self.environs.get(pid)


def device(details: list[DeviceDetail], name: str) -> DeviceDetail:
    return next(d for d in details if d.device == name)


def test_the_default_gpu_limit_follows_macos_split() -> None:
    assert default_gpu_limit(16 * GIB) == 16 * GIB * 2 // 3
    assert default_gpu_limit(36 * GIB) == 24 * GIB
    assert default_gpu_limit(64 * GIB) == 48 * GIB


def test_the_gpu_limit_comes_from_the_sysctl_then_metal_then_the_default() -> None:
    mac = FakeMac(ram=64 * GIB, wired_limit_mb=56 * 1024, metal=50 * GIB)
    assert AppleMeter(mac).device_totals() == {"host": 64 * GIB, "gpu0": 56 * GIB}
    assert "iogpu.wired_limit_mb" in AppleMeter(mac).mode_detail
    mac.wired_limit_mb = 0
    assert AppleMeter(mac).device_totals()["gpu0"] == 50 * GIB
    assert "recommendedMaxWorkingSetSize" in AppleMeter(mac).mode_detail
    mac.metal = None
    meter = AppleMeter(mac)
    assert meter.device_totals()["gpu0"] == 48 * GIB
    assert "3/4 of RAM (no Metal binding installed)" in meter.mode_detail


def test_a_gpu_backend_holds_its_tree_footprint_on_both_devices() -> None:
    mac = FakeMac()
    gpu_env = visible_devices_env(("gpu0",))
    mac.add(100, phys=6 * GIB, resident=2 * GIB, env=gpu_env)
    mac.add(101, phys=1 * GIB, resident=1 * GIB, parent=100)
    mac.add(200, phys=3 * GIB, resident=3 * GIB)  # somebody else
    details = AppleMeter(mac).sample({"llm": 100})
    host, gpu = device(details, "host"), device(details, "gpu0")
    truth = 7 * GIB  # footprint includes the Metal buffers
    assert host.backends["llm"].held_bytes == truth
    assert gpu.backends["llm"].held_bytes == truth
    assert host.backends["llm"].pids == (100, 101)
    assert host.used_bytes == 24 * GIB  # 64 GiB RAM, 40 available
    assert gpu.used_bytes == truth  # others' GPU use is not visible per process
    assert gpu.attribution == "per-process"


def test_mmapd_weights_count_through_the_resident_size() -> None:
    """Clean file pages are not in the footprint: an mmap'd model shows in
    the resident size, and it is held (CPU backends compute on it, llama.cpp's
    Metal backend hands it to the GPU without a copy)."""
    mac = FakeMac()
    mac.add(100, phys=400 * MIB, resident=900 * MIB, env=visible_devices_env(()))
    details = AppleMeter(mac).sample({"cpu-llm": 100})
    usage = device(details, "host").backends["cpu-llm"]
    assert usage.held_bytes == 900 * MIB
    assert usage.file_backed_held
    # Placed on no GPU: not credited on the GPU.
    assert device(details, "gpu0").backends["cpu-llm"].held_bytes == 0


def test_a_gone_backend_holds_nothing() -> None:
    details = AppleMeter(FakeMac()).sample({"gone": 4242})
    assert device(details, "host").backends["gone"].held_bytes == 0
    assert device(details, "gpu0").backends["gone"].held_bytes == 0


def test_default_meter_on_a_mac_is_the_apple_meter_and_names_gpu0(tmp_path: Path) -> None:
    meter = default_meter(apple=FakeMac(), platform="darwin")
    assert meter.mode == "apple"
    assert "gpu0 (Apple M2 Max" in meter.mode_detail
    layout = recorded_layout()
    assert layout is not None and layout.place("gpu0") is not None
    # Metal has no visible-devices variable: only yard's own placement marker.
    assert visible_devices_env(("gpu0",))["YARD_GPUS"] == "gpu0"
    assert "ROCR_VISIBLE_DEVICES" not in visible_devices_env(("gpu0",))


def test_an_intel_mac_is_host_only_by_footprint() -> None:
    mac = FakeMac(apple_silicon=False)
    mac.add(100, phys=2 * GIB, resident=GIB)
    meter = AppleMeter(mac)
    assert meter.mode == "host-only"
    assert "Intel Mac" in meter.mode_detail
    assert meter.device_totals() == {"host": 64 * GIB}
    (host,) = meter.sample({"llm": 100})
    assert host.backends["llm"].held_bytes == 2 * GIB


def test_the_real_source_refuses_anything_but_macos() -> None:
    with pytest.raises(AppleUnavailable, match="not macOS"):
        LibprocSource(platform="linux")

"""First contact does not depend on the vendor: a never-measured model on a
busy card is placed by its prior next to what each meter sees, for NVML, the
kernel's DRM interface and Apple silicon, on their recorded fixtures.

Each meter's reading goes to the core as the engine sends it
(:meth:`yard.ports.DeviceReading` -> ``MemoryMeasured``), and the first start
must get the largest context the prior fits in what is free there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.memory.fake_drm import FakeDrm
from tests.memory.test_apple_meter import FakeMac
from tests.memory.test_drm_meter import AMD_SLOT
from yard.core import BackendSpec, MemoryMeasured, RequestArrived, Scheduler, StartBackend
from yard.demo.tinymodel import write_tiny_llama
from yard.memory import AppleMeter, default_meter
from yard.memory.prior import prior_for
from yard.testing.gpu import FakeGpu, FakeNvml

GIB = 1 << 30


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 layers, 4 KV heads of 64: 16 KiB of f16 cache a token, trained 131,072."""
    path = tmp_path_factory.mktemp("m") / "m.gguf"
    write_tiny_llama(
        path, n_layers=16, n_embd=256, n_head=4, n_kv_head=4, n_ff=512, vocab_size=1024,
        context_length=131072,
    )  # fmt: skip
    return path


async def first_start(meter: object, model: Path, *, unified: bool = False) -> StartBackend:
    """Feed one reading of ``meter`` to a core holding a never-measured GPU
    backend with ``model``; return its first start."""
    totals = meter.device_totals()  # type: ignore[attr-defined]
    per_process = meter.per_process_devices()  # type: ignore[attr-defined]
    prior = prior_for(["-m", str(model)], None, None, on_gpu=True, unified=unified)
    assert prior is not None
    from yard.core import HOST, DeviceSpec

    devices = [
        DeviceSpec(
            name=name,
            kind="host" if name == HOST else "gpu",
            total_bytes=total,
            per_process=name in per_process,
        )
        for name, total in totals.items()
    ]
    spec = BackendSpec(name="llm", gpus=("gpu0",), context=(4096, 131072), prior=prior)
    s = Scheduler(devices, [spec])
    for r in await meter.read({}):  # type: ignore[attr-defined]
        s.handle(
            MemoryMeasured(
                device=r.device, used_bytes=r.used_bytes, backends=tuple(r.backends.items())
            ),
            0,
        )
    [start] = s.handle(RequestArrived(request_id="r1", backend="llm", priority=50), 1)
    assert isinstance(start, StartBackend) and start.context is not None
    assert "estimated from the model file" in start.reason
    return start


async def test_nvml_a_foreign_process_leaves_2_gib(model: Path) -> None:
    gpu = FakeGpu(total=24 * GIB, reserved=0, used=22 * GIB)
    meter = default_meter(nvml=FakeNvml([gpu]), amdsmi=False, sys_root=Path("/nonexistent"))
    start = await first_start(meter, model)
    assert 60_000 < start.context < 131072  # type: ignore[operator]


async def test_drm_a_foreign_process_leaves_2_gib(tmp_path: Path, model: Path) -> None:
    fake = FakeDrm(tmp_path)
    fake.card(
        1, slot=AMD_SLOT, driver="amdgpu", pci_id="1002:744C", render=128,
        vram_total=24 * GIB, vram_used=22 * GIB, unique_id="f980f88ef31631a2",
    )  # fmt: skip
    meter = default_meter(nvml=FakeNvml([]), proc=fake.proc.root, sys_root=fake.sys)
    start = await first_start(meter, model)
    nvml_meter = default_meter(
        nvml=FakeNvml([FakeGpu(total=24 * GIB, reserved=0, used=22 * GIB)]),
        amdsmi=False,
        sys_root=Path("/nonexistent"),
    )
    same = await first_start(nvml_meter, model)
    assert start.context == same.context  # the same card, the same first start


async def test_apple_unified_memory_a_busy_mac_limits_by_its_ram(model: Path) -> None:
    """64 GiB Mac, GPU limit 48 GiB, 2 GiB available (other apps): the model's
    footprint is on both devices, so the RAM left decides, not the GPU limit."""
    mac = FakeMac(ram=64 * GIB, free=2 * GIB)
    start = await first_start(AppleMeter(mac), model, unified=True)
    prior = prior_for(["-m", str(model)], None, None, on_gpu=True, unified=True)
    assert prior is not None and prior.profile.host_bytes == prior.profile.gpu_bytes
    assert 60_000 < start.context < 131072  # type: ignore[operator]
    roomy = await first_start(
        AppleMeter(dataclasses.replace(mac, free=40 * GIB)), model, unified=True
    )
    assert roomy.context == 131072

"""The host meter against real processes holding known amounts of memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.memory.fake_proc import FakeProc
from yard.memory import HostMeter
from yard.memory.readings import DeviceDetail
from yard.testing.ports import FakeMeter
from yard.testing.process import running_backend

MIB = 1 << 20


def host(details: list[DeviceDetail]) -> DeviceDetail:
    (detail,) = details
    assert detail.device == "host"
    return detail


def test_a_tree_is_summed_and_file_pages_are_counted_apart(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, anon_kib=1000, shmem_kib=24, file_kib=500)
    proc.add(101, ppid=100, anon_kib=2000, file_kib=70)
    proc.add(102, ppid=101, anon_kib=4000)
    proc.add(200, anon_kib=8000)  # not ours
    detail = host(HostMeter(proc=proc.root).sample({"llm": 100, "gone": 999}))
    assert detail.backends["llm"].held_bytes == 7024 * 1024
    assert detail.backends["llm"].reclaimable_bytes == 570 * 1024
    assert detail.backends["llm"].pids == (100, 101, 102)
    assert detail.backends["gone"].held_bytes == 0  # exited: holds nothing
    assert detail.total_bytes > 0
    assert 0 <= detail.used_bytes <= detail.total_bytes


async def _held(meter: HostMeter, pid: int) -> int:
    (detail,) = await meter.read_details({"b": pid})
    return detail.backends["b"].held_bytes


async def _measured_backend(memory: str, *, grow: str | None = None) -> tuple[int, int | None]:
    """Held bytes of a test backend once ready, and after its first request
    (when it grows)."""
    meter = HostMeter()
    async with running_backend(memory=memory, grow_after_first=grow) as backend:
        ready = await _held(meter, backend.pid)
        if grow is None:
            return ready, None
        async with httpx.AsyncClient(base_url=backend.base_url) as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "test-model", "messages": [{"role": "user", "content": "hi"}]},
            )
            response.raise_for_status()
        return ready, await _held(meter, backend.pid)


@pytest.mark.slow
async def test_a_backend_holding_200_mib_is_measured_within_2_percent() -> None:
    with trio.fail_after(60):
        baseline, _ = await _measured_backend("0")
        holding, grown = await _measured_backend("200MiB", grow="100MiB")
    # The interpreter's own memory is the same in both runs; what the meter
    # adds on top of it must be what the backend allocated.
    assert abs((holding - baseline) - 200 * MIB) <= 0.02 * 200 * MIB, (baseline, holding)
    assert grown is not None
    assert abs((grown - baseline) - 300 * MIB) <= 0.02 * 300 * MIB, (baseline, grown)


_TREE = """
import mmap, os, sys, time
held = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
if sys.argv[2] != "-":
    with open(sys.argv[2], "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        total = sum(m[i] for i in range(0, len(m), 4096))
if len(sys.argv) > 3:
    import subprocess
    subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[4], "-"])
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
async def test_a_real_parent_and_child_are_summed_and_an_mmapped_file_is_apart(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(os.urandom(1 << 20) * 64)  # 64 MiB "model file"
    meter = HostMeter()
    lone = await _tree_memory(meter, [sys.executable, "-c", _TREE, "0", "-"], expect=1)
    parent_only = await _tree_memory(meter, [sys.executable, "-c", _TREE, "64", "-"], expect=1)
    tree = await _tree_memory(
        meter, [sys.executable, "-c", _TREE, "64", str(model), _TREE, "96"], expect=2
    )
    # Two interpreters (parent and child), 64 MiB in one and 96 MiB in the other.
    expected = 2 * lone.held_bytes + 160 * MIB
    assert abs(tree.held_bytes - expected) <= 0.02 * expected, (lone.held_bytes, tree.held_bytes)
    assert abs(parent_only.held_bytes - lone.held_bytes - 64 * MIB) <= 0.02 * 64 * MIB
    # The mapped file is resident but reclaimable, and not counted as held.
    assert tree.reclaimable_bytes - parent_only.reclaimable_bytes >= 60 * MIB


async def _tree_memory(meter: HostMeter, argv: list[str], *, expect: int) -> _Usage:
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            argv, stdout=subprocess.PIPE, start_new_session=True
        )
        try:
            assert process.stdout is not None
            seen = b""
            while seen.count(b"ready") < expect:
                chunk = await process.stdout.receive_some(1024)
                assert chunk, "the process tree died"
                seen += chunk
            (detail,) = await meter.read_details({"tree": process.pid})
            usage = detail.backends["tree"]
            assert len(usage.pids) == expect
            return _Usage(usage.held_bytes, usage.reclaimable_bytes)
        finally:
            with trio.CancelScope(shield=True):
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


class _Usage:
    def __init__(self, held_bytes: int, reclaimable_bytes: int) -> None:
        self.held_bytes = held_bytes
        self.reclaimable_bytes = reclaimable_bytes


async def test_the_fake_meter_counts_only_running_backends_and_foreign_use() -> None:
    meter = FakeMeter({"host": 64 * MIB, "gpu0": 80 * MIB})
    meter.set_backend("gpu0", "llm", 10 * MIB)
    meter.set_backend("gpu0", "tts", 5 * MIB)
    meter.set_foreign("gpu0", 3 * MIB)
    readings = {r.device: r for r in await meter.read({"llm": 1})}
    assert readings["gpu0"].backends == {"llm": 10 * MIB}
    assert readings["gpu0"].used_bytes == 13 * MIB
    assert readings["host"].backends == {}
    assert meter.device_totals() == {"host": 64 * MIB, "gpu0": 80 * MIB}

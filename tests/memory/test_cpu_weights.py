"""The mmap trap: a backend that computes on the CPU holds its mmap'd weights.

A CPU llama-server with a 500 MB model was profiled at 368 MB of anonymous
memory while 515 MB of its weights sat in file-backed pages left out of its
reservation: packing such backends drives the host into page-cache thrashing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.memory.fake_proc import FakeProc
from yard.config import load_config
from yard.memory import HostMeter
from yard.memory.gpus import visible_devices_env
from yard.memory.procfs import read_status

MIB = 1 << 20


def test_a_cpu_backend_holds_its_file_backed_pages(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, anon_kib=368_000, file_kib=515_000, environ=visible_devices_env(()))
    proc.add(101, ppid=100, anon_kib=1000, file_kib=24)
    (detail,) = HostMeter(proc=proc.root).sample({"cpu-llm": 100})
    usage = detail.backends["cpu-llm"]
    assert usage.held_bytes == (368_000 + 515_000 + 1000 + 24) * 1024
    assert usage.reclaimable_bytes == 0
    assert usage.file_backed_held


def test_a_gpu_backend_keeps_its_file_pages_apart(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, anon_kib=368_000, file_kib=515_000, environ=visible_devices_env(("gpu0",)))
    (detail,) = HostMeter(proc=proc.root).sample({"gpu-llm": 100})
    usage = detail.backends["gpu-llm"]
    assert usage.held_bytes == 368_000 * 1024
    assert usage.reclaimable_bytes == 515_000 * 1024
    assert not usage.file_backed_held


def test_a_process_yard_did_not_place_keeps_the_old_rule(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(100, anon_kib=10, file_kib=20, environ={"PATH": "/bin"})
    (detail,) = HostMeter(proc=proc.root).sample({"x": 100})
    assert detail.backends["x"].held_bytes == 10 * 1024


_MMAP_AND_TOUCH = """
import mmap, sys, time
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
total = 0
for offset in range(0, len(m), 4096):
    total += m[offset]
print("ready", flush=True)
time.sleep(60)
"""


def _rss_bytes(pid: int) -> int:
    status = read_status(pid)
    assert status is not None
    return int(status["VmRSS"].split()[0]) * 1024


@pytest.mark.slow
@pytest.mark.parametrize("on_cpu", [True, False])
async def test_reservation_of_a_real_cpu_process_matches_its_rss(
    tmp_path: Path, on_cpu: bool
) -> None:
    """A real process that mmaps and reads a 50 MiB file: placed on the CPU,
    what yard reserves for it is within 5 % of its /proc RSS; placed on a GPU,
    its 50 MiB of file pages stay out (the old rule, kept for GPU backends)."""
    weights = tmp_path / "weights.bin"
    weights.write_bytes(os.urandom(50 * MIB))
    env = dict(os.environ) | visible_devices_env(() if on_cpu else ("gpu0",))
    child = await trio.lowlevel.open_process(
        [sys.executable, "-c", _MMAP_AND_TOUCH, str(weights)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert child.stdout is not None
        with trio.fail_after(30):
            line = await child.stdout.receive_some()
        assert line.strip() == b"ready"
        (detail,) = await HostMeter().read_details({"cpu": child.pid})
        held = detail.backends["cpu"].held_bytes
        rss = _rss_bytes(child.pid)
    finally:
        child.kill()
        with trio.fail_after(10):
            await child.wait()
    if on_cpu:
        assert abs(held - rss) <= 0.05 * rss, (held, rss)
    else:
        assert rss - held >= 45 * MIB, (held, rss)


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [(), ("gpu0",)])
async def test_the_supervisor_marks_the_placement_the_host_meter_reads(
    tmp_path: Path, gpus: tuple[str, ...]
) -> None:
    """End to end: the supervisor's environment tells the host meter whether
    the backend computes on the CPU (its mmap'd 50 MiB then held) or not."""
    from yard.supervisor import Supervisor

    weights = tmp_path / "weights.bin"
    weights.write_bytes(os.urandom(50 * MIB))
    script = tmp_path / "mmap_and_touch.py"
    script.write_text(_MMAP_AND_TOUCH)
    config = tmp_path / "yard.toml"
    config.write_text(
        '[server]\ndata_dir = "data"\nstop_grace_s = 2\n'
        f'[backends.weights]\nmodels = ["w"]\ncommand = ["{{python}}", "{script}", '
        f'"{{model_file}}"]\nmodel_file = "{weights}"\n'
    )
    supervisor = Supervisor(load_config(config, env={}))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            process = await supervisor.launch("weights", gpus)
            for _ in range(500):  # its output reaches the log through a pipe
                if any("ready" in line for line in supervisor.log_lines("weights")):
                    break
                await trio.sleep(0.05)
            assert process.pid is not None
            (detail,) = await HostMeter().read_details({"weights": process.pid})
            usage = detail.backends["weights"]
            rss = _rss_bytes(process.pid)
            await process.stop()
            nursery.cancel_scope.cancel()
    if gpus:
        assert usage.reclaimable_bytes >= 45 * MIB and rss - usage.held_bytes >= 45 * MIB
    else:
        assert abs(usage.held_bytes - rss) <= 0.05 * rss, (usage, rss)
        assert usage.file_backed_held

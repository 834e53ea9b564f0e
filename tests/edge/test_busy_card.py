"""First contact with a busy card, end to end (issue 22, cases 1-3).

A real ``yard serve`` meters a shared fake GPU (:mod:`yard.testing.gpu`,
through ``$YARD_TESTING_FAKE_GPU``) that another process already fills; its
backends are the test backend acting as llama-server on that card: it
allocates by its context what the model file's estimate gives there, times a
skew (a real server may need more), and where that does not fit it logs
llama.cpp's out-of-memory lines and exits, or stays up answering 503.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.edge.harness import Yard, get, post, start_yard
from yard.demo.tinymodel import write_tiny_llama
from yard.testing.gpu import ENV_VAR, SharedGpu

pytestmark = pytest.mark.slow

GIB = 1 << 30
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def backend(
    name: str, gpu: Path, model: Path, *, extra: str = "", switches: tuple[str, ...] = ()
) -> str:
    argv = [
        "{python}", "-m", "yard.testing.backend", "--port", "{port}", "--model", name,
        "--gpu-file", str(gpu), "--model-file", "{model_file}", *switches,
    ]  # fmt: skip
    return (
        f"[backends.{name}]\nmodels = [{json.dumps(name)}]\ncommand = {json.dumps(argv)}\n"
        f'gpus = ["gpu0"]\nmodel_file = {json.dumps(str(model))}\nstartup_timeout_s = 60\n'
        f"{extra}\n"
    )


def llama(path: Path, trained: int) -> Path:
    """16 layers of 256 (4 KV heads of 64): 16 KiB of f16 cache a token."""
    write_tiny_llama(
        path, n_layers=16, n_embd=256, n_head=4, n_kv_head=4, n_ff=512, vocab_size=1024,
        context_length=trained,
    )  # fmt: skip
    return path


def busy_yard(
    monkeypatch: pytest.MonkeyPatch, work: Path, *, total: int, foreign: int, body: str
) -> tuple[Yard, SharedGpu]:
    gpu = SharedGpu.create(work / "gpu0.json", total_bytes=total, foreign_bytes=foreign)
    monkeypatch.setenv(ENV_VAR, str(gpu.path))
    return start_yard(work, body), gpu


def chat(yard: Yard, model: str = "m") -> int:
    body = CHAT.replace(b'"m"', json.dumps(model).encode())
    return post(yard, "/v1/chat/completions", body, timeout=90).status


def failed_starts(yard: Yard) -> int:
    """Starts that failed, as yard logs each once (a warning)."""
    return len(re.findall(r"WARNING \S+: \S+ failed to start: ", yard.log()))


@pytest.mark.parametrize("stays_up", [False, True], ids=["exits", "stays-up"])
def test_a_never_measured_model_on_a_busy_card_serves_both_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stays_up: bool
) -> None:
    """Case 1: 2 GiB free next to a foreign process; the model's range goes to
    131,072 tokens (2.1 GiB of cache alone). The server needs 20 % more than
    its estimate: the start at the estimate's fit runs out of memory once, the
    next is at the minimum, and both requests are answered."""
    model = llama(tmp_path / "m.gguf", trained=131072)
    switches: tuple[str, ...] = ("--context", "{context}", "--skew", "1.2")
    if stays_up:
        switches += ("--oom-stays-up",)
    body = backend(
        "m", tmp_path / "gpu0.json", model,
        extra="context = { min = 4096, max = 131072 }", switches=switches,
    )  # fmt: skip
    yard, gpu = busy_yard(monkeypatch, tmp_path, total=8 * GIB, foreign=6 * GIB, body=body)
    try:
        t0 = time.monotonic()
        assert chat(yard) == 200
        assert chat(yard) == 200
        took = time.monotonic() - t0
        log = yard.log()
        assert failed_starts(yard) == 1, log
        starts = [line for line in log.splitlines() if "starting m:" in line]
        first = int(starts[0].split("context ")[1].split(" ")[0])
        # the estimate's fit: 2 GiB free, margin 1.1, 17 KiB a token after
        # the CUDA context and the weights: about 80,000 tokens
        assert 60_000 < first < 90_000, starts[0]
        assert "estimated from the model file" in starts[0]
        assert "context 4096 (of 4096-131072): its minimum" in starts[-1]
        if stays_up:
            # stopped at once when it said so, not after its 60 s start-up timeout
            assert took < 30
        models = get(yard, "/v1/models").json()["data"]
        assert isinstance(models, list) and models[0]["context"] == 4096
    finally:
        yard.stop()
    assert gpu.state()["allocations"] == {}


def test_a_never_measured_30_gib_model_makes_room_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 2: 140 GiB card, 100 GiB foreign, a 30 GiB idle neighbour; the
    new 30 GiB model (its file's size is all that is known) stops the
    neighbour before it starts: no out-of-memory."""
    files = []
    for name in ("old", "new"):
        f = tmp_path / f"{name}.bin"
        with f.open("wb") as out:
            out.truncate(30 * GIB)  # sparse: 30 GiB that take no disk
        files.append(f)
    body = backend("old", tmp_path / "gpu0.json", files[0]) + backend(
        "new", tmp_path / "gpu0.json", files[1]
    )
    yard, _ = busy_yard(monkeypatch, tmp_path, total=140 * GIB, foreign=100 * GIB, body=body)
    try:
        assert chat(yard, "old") == 200
        assert chat(yard, "new") == 200
        log = yard.log()
        assert failed_starts(yard) == 0, log
        assert "stopping old" in log
    finally:
        yard.stop()


def test_the_context_yard_reports_is_the_one_the_server_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 3: a model trained for 2,048 tokens under a range up to 4,096:
    yard offers no more than 2,048, and /v1/models says what /props said."""
    model = llama(tmp_path / "m.gguf", trained=2048)
    body = backend(
        "m", tmp_path / "gpu0.json", model,
        extra="context = { min = 512, max = 4096 }",
        switches=("--context", "{context}", "--parallel", "2"),
    )  # fmt: skip
    yard, _ = busy_yard(monkeypatch, tmp_path, total=8 * GIB, foreign=GIB, body=body)
    try:
        assert chat(yard) == 200
        models = get(yard, "/v1/models").json()["data"]
        assert isinstance(models, list)
        assert models[0]["context"] == 2048
        assert models[0]["parallel"] == 2  # /props total_slots
        assert "the context the model was trained for" in yard.log()
    finally:
        yard.stop()
    assert os.environ.get(ENV_VAR)

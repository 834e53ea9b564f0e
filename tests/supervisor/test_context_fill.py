"""Measured first loads of llama-server backends: a full-context prompt before ready."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from yard.config import BackendConfig, FillContext, load_config
from yard.demo.llama_server import find_llama_server
from yard.demo.tinymodel import write_sized_llama
from yard.ports import BackendStartError
from yard.supervisor import Supervisor, fills_context

MIB = 1 << 20

# A stand-in for llama.cpp's server: its file name contains "llama-server",
# so the supervisor's "auto" recognises it. It prints each request it gets.
FAKE_LLAMA = r"""
import http.server, json, os, sys

N_CTX = 64
mode = sys.argv[2] if len(sys.argv) > 2 else "ok"


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.answer(200, {"status": "ok"})
        elif self.path == "/props" and mode != "no-props":
            self.answer(200, {"default_generation_settings": {"n_ctx": N_CTX}})
        else:
            self.answer(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
        if self.path == "/tokenize":
            self.answer(200, {"tokens": [11, 22, 33]})
        elif self.path == "/completion":
            print(f"completion of {len(body['prompt'])} tokens", flush=True)
            if mode == "oom":
                print("CUDA error: out of memory", file=sys.stderr, flush=True)
                os._exit(1)
            self.answer(200, {"content": "ok"})
        else:
            print(f"warm-up {self.path}", flush=True)
            self.answer(200, {"choices": []})


server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("listening", flush=True)
server.serve_forever()
"""


def llama_toml(tmp_path: Path, name: str, *, mode: str = "ok", fill: str | None = None) -> str:
    script = tmp_path / "fake-llama-server.py"
    script.write_text(FAKE_LLAMA)
    command = ["{python}", str(script), "{port}", mode]
    warmup = f"[backends.{name}.warmup]\npath = \"/v1/completions\"\njson = {{ prompt = 'hi' }}\n"
    if fill is not None:
        warmup += f"fill_context = {fill}\n"
    return f'[backends.{name}]\nmodels = ["{name}"]\ncommand = {json.dumps(command)}\n{warmup}'


@asynccontextmanager
async def supervising(tmp_path: Path, text: str) -> AsyncIterator[Supervisor]:
    path = tmp_path / "yard.toml"
    path.write_text(f'[server]\ndata_dir = "data"\nstop_grace_s = 2\n{text}')
    supervisor = Supervisor(load_config(path, env={}))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        yield supervisor
        nursery.cancel_scope.cancel()


def requests_seen(supervisor: Supervisor, backend: str) -> list[str]:
    """The requests the fake printed, in order."""
    return [
        line for line in supervisor.log_lines(backend) if line.startswith(("completion", "warm-up"))
    ]


async def eventually(check: Callable[[], bool]) -> None:
    """The backend's output reaches the log through a pipe: give it a moment."""
    for _ in range(500):
        if check():
            return
        await trio.sleep(0.01)
    raise AssertionError("not within 5 s")


def backend(fill: FillContext) -> BackendConfig:
    return BackendConfig(name="b", models=("m",), command=("x",), fill_context=fill)


@pytest.mark.parametrize(
    ("fill", "argv", "measure", "expected"),
    [
        ("auto", ["/opt/llama.cpp/bin/llama-server", "-m", "x.gguf"], True, True),
        ("auto", ["/usr/bin/python3", "-m", "yard.demo.llama_server"], True, True),
        ("auto", ["/opt/llama.cpp/bin/llama-server", "-m", "x.gguf"], False, False),
        ("auto", ["vllm", "serve", "llama-3"], True, False),
        (True, ["./run-my-model.sh"], True, True),
        (True, ["./run-my-model.sh"], False, False),
        (False, ["llama-server", "-m", "x.gguf"], True, False),
    ],
)
def test_only_measured_loads_fill_the_context_as_the_switch_says(
    fill: FillContext, argv: list[str], measure: bool, expected: bool
) -> None:
    assert fills_context(backend(fill), argv, measure=measure) is expected


@pytest.mark.slow
async def test_a_measured_llama_load_is_ready_only_after_a_full_context_prompt(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path, llama_toml(tmp_path, "llm")) as supervisor:
            process = await supervisor.launch("llm", (), measure=True)
            await process.wait_ready()
            assert "[yard] context filled" in supervisor.log_lines("llm")
            # The configured warm-up first, then n_ctx (64) less 8 tokens.
            await eventually(lambda: len(requests_seen(supervisor, "llm")) == 2)
            assert requests_seen(supervisor, "llm") == [
                "warm-up /v1/completions",
                "completion of 56 tokens",
            ]
            await process.stop()
            # A load that is not measured (the profile is known) skips it.
            again = await supervisor.launch("llm", (), measure=False)
            await again.wait_ready()
            await eventually(lambda: len(requests_seen(supervisor, "llm")) == 3)
            await trio.sleep(0.2)
            assert requests_seen(supervisor, "llm")[2:] == ["warm-up /v1/completions"]


@pytest.mark.slow
async def test_fill_context_false_keeps_a_measured_llama_load_to_its_warm_up(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        text = llama_toml(tmp_path, "llm", fill="false")
        async with supervising(tmp_path, text) as supervisor:
            process = await supervisor.launch("llm", (), measure=True)
            await process.wait_ready()
            await eventually(lambda: len(requests_seen(supervisor, "llm")) == 1)
            await trio.sleep(0.2)
            assert requests_seen(supervisor, "llm") == ["warm-up /v1/completions"]
            assert not any("[yard] context" in line for line in supervisor.log_lines("llm"))


@pytest.mark.slow
async def test_a_failed_guess_still_starts_but_a_required_fill_fails_the_start(
    tmp_path: Path,
) -> None:
    text = llama_toml(tmp_path, "guessed", mode="no-props") + llama_toml(
        tmp_path, "required", mode="no-props", fill="true"
    )
    with trio.fail_after(30):
        async with supervising(tmp_path, text) as supervisor:
            guessed = await supervisor.launch("guessed", (), measure=True)
            await guessed.wait_ready()
            assert any("context fill failed" in line for line in supervisor.log_lines("guessed"))
            required = await supervisor.launch("required", (), measure=True)
            with pytest.raises(BackendStartError, match="context fill failed"):
                await required.wait_ready()
            assert not required.ready


@pytest.mark.slow
async def test_running_out_of_memory_under_the_fill_fails_the_start_as_oom(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with supervising(tmp_path, llama_toml(tmp_path, "llm", mode="oom")) as supervisor:
            process = await supervisor.launch("llm", (), measure=True)
            with pytest.raises(BackendStartError, match="exited before it was ready") as info:
                await process.wait_ready()
            assert info.value.oom


@pytest.mark.slow
async def test_cuda_numbers_gpus_in_pci_order_like_nvml_unless_the_backend_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # yard itself may have inherited another order; its backends must not.
    monkeypatch.setitem(os.environ, "CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    script = "import os; print('ORDER=' + os.environ['CUDA_DEVICE_ORDER'])"
    text = textwrap.dedent(
        f"""
        [backends.default]
        models = ["a"]
        command = [{json.dumps(sys.executable)}, "-c", "{script}"]
        [backends.own]
        models = ["b"]
        command = [{json.dumps(sys.executable)}, "-c", "{script}"]
        env = {{ CUDA_DEVICE_ORDER = "FASTEST_FIRST" }}
        """
    )
    with trio.fail_after(30):
        async with supervising(tmp_path, text) as supervisor:
            for name in ("default", "own"):
                process = await supervisor.launch(name, ())
                assert (await process.wait_exit()).code == 0
            assert "ORDER=PCI_BUS_ID" in supervisor.log_lines("default")
            assert "ORDER=FASTEST_FIRST" in supervisor.log_lines("own")


def held_bytes(pid: int) -> int:
    """What the process holds (anonymous + shared memory), from /proc."""
    held = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            held += int(line.split()[1]) * 1024
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            held += int(line.split()[1]) * 1024
    return held


@pytest.mark.slow
@pytest.mark.skipif(
    find_llama_server() is None or not Path("/proc/self/smaps_rollup").exists(),
    reason="needs llama-server (`make demo-setup`) and Linux /proc",
)
async def test_a_measured_real_llama_server_is_ready_at_its_worst_case_footprint(
    tmp_path: Path,
) -> None:
    model = write_sized_llama(tmp_path / "m50.gguf", size_mb=50, n_layers=4)
    command = [
        "{python}", "-m", "yard.demo.llama_server", "--host", "{host}", "--port", "{port}",
        "-m", "{model_file}", "-c", "2048", "-np", "1",
    ]  # fmt: skip
    text = (
        f'[backends.llm]\nmodels = ["tiny"]\ncommand = {json.dumps(command)}\n'
        f'model_file = "{model.path}"\n'
    )
    held: dict[bool, int] = {}
    with trio.fail_after(120):
        async with supervising(tmp_path, text) as supervisor:
            for measure in (False, True):
                process = await supervisor.launch("llm", (), measure=measure)
                await process.wait_ready()
                assert process.pid is not None
                held[measure] = held_bytes(process.pid)
                await process.stop()
    mib = {measure: round(value / MIB, 1) for measure, value in held.items()}
    print(f"llama-server 50 MB model, ctx 2048, held at ready: {mib}")
    # The full prompt touches the compute buffers' pages: ~20 MiB more here.
    assert held[True] >= held[False] + 8 * MIB, mib

#!/usr/bin/env python3
"""Issue 22's three cases on a real NVIDIA GPU (run by ``scripts/gpu_first_contact.sh``).

    .venv/bin/python scripts/gpu_first_contact.py [--gpu 0] [--out DIR]

Needs a llama-server built for CUDA (the shell script builds one) and one
GPU with at least 48 GiB. Each case runs a real ``yard serve`` on the GPU,
with a foreign process holding memory (``scripts/nvml_check.py``'s CUDA
child), generated llama models (nothing downloaded) and requests through
yard, and prints what happened next to the target:

1. a never-measured model with ``context = { min = 4096, max = 65536 }``
   next to a foreign process leaving 6 GiB: both requests 200, at most one
   failed start, started at a context no larger than what fits;
2. two never-measured ~27 GiB servers on a card where a foreign process
   leaves 40 GiB: the second stops the first before it starts, 0 failed
   starts;
3. a model trained for 2,048 tokens under ``context = { min = 512, max =
   4096 }``: ``/v1/models`` says 2,048, as llama-server's ``/props``.

Exit status 0 when every case meets its target. Logs stay in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
YARD = "import sys; from yard.cli import main; sys.exit(main())"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def gpu_free(gpu: int) -> int:
    out = subprocess.run(
        ["nvidia-smi", f"--id={gpu}", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.strip()) << 20


@contextmanager
def foreign(gpu: int, leave: int) -> Iterator[None]:
    """A process yard does not own holding all but ``leave`` bytes of the GPU."""
    size = max(0, gpu_free(gpu) - leave - 600 * (1 << 20))  # its own CUDA context
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "nvml_check.py"), "--hold",
         "--bytes", str(size), "--gpu", str(gpu)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "context"
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == "allocated", "the foreign allocation failed"
    print(f"  foreign process holds {size / GIB:.1f} GiB; {gpu_free(gpu) / GIB:.1f} GiB free")
    try:
        yield
    finally:
        child.stdin.close()
        child.wait(30)


def model(out: Path, name: str, *args: str) -> Path:
    path = out / f"{name}.gguf"
    if not path.exists():
        subprocess.run(
            [sys.executable, "-m", "yard.demo.tinymodel", str(path), *args],
            check=True, capture_output=True,
        )  # fmt: skip
    return path


GPU = "gpu0"  # yard's name of the GPU under test (--gpu N: gpuN)


def backend(name: str, gguf: Path, extra: str, *server: str) -> str:
    argv = ["{python}", "-m", "yard.demo.llama_server", "--host", "{host}", "--port", "{port}",
            "--model", str(gguf), "-ngl", "99", "-np", "1", *server]  # fmt: skip
    return (
        f'[backends.{name}]\nmodels = ["{name}"]\ncommand = {json.dumps(argv)}\n'
        f'gpus = ["{GPU}"]\nstartup_timeout_s = 180\n{extra}\n'
    )


@contextmanager
def yard(out: Path, case: str, body: str, gpu: int) -> Iterator[str]:
    port = free_port()
    work = out / case
    work.mkdir(parents=True, exist_ok=True)
    config = work / "yard.toml"
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "{work / "data"}"\n\n{body}'
    )
    log = (work / "yard.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", YARD, "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT, env=dict(os.environ),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(120)
        log.close()


def chat(url: str, name: str) -> int:
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).status_code


def log_of(out: Path, case: str) -> str:
    return (out / case / "yard.log").read_text(errors="replace")


def failed_starts(text: str) -> int:
    return len(re.findall(r"WARNING \S+: \S+ failed to start: ", text))


def case1(out: Path, gpu: int) -> bool:
    print("case 1: a never-measured model with a range, 6 GiB free next to a foreign process")
    m = model(out, "m1g", "--layers", "16", "--n-embd", "1600", "--ctx", "131072")
    body = backend("llm", m, "context = { min = 4096, max = 65536 }", "-c", "{context}")
    with foreign(gpu, 6 * GIB), yard(out, "case1", body, gpu) as url:
        statuses = [chat(url, "llm"), chat(url, "llm")]
    text = log_of(out, "case1")
    contexts = [int(c) for c in re.findall(r"starting llm: .*?; context (\d+) ", text)]
    fails = failed_starts(text)
    print(f"  statuses {statuses}, starts at {contexts}, failed starts {fails}")
    return statuses == [200, 200] and fails <= 1 and bool(contexts) and contexts[0] < 65536


def case2(out: Path, gpu: int) -> bool:
    print("case 2: two never-measured ~27 GiB servers, 40 GiB free next to a foreign process")
    m = model(out, "m1g-long", "--layers", "16", "--n-embd", "1600", "--ctx", "262144")
    # no context fill: 262,144 tokens of prompt is minutes; the case is the room
    quick = '[backends.{}.warmup]\nmethod = "GET"\npath = "/health"\nfill_context = false\n'
    body = backend("a", m, quick.format("a"), "-c", "262144") + backend(
        "b", m, quick.format("b"), "-c", "262144"
    )
    with foreign(gpu, 40 * GIB), yard(out, "case2", body, gpu) as url:
        statuses = [chat(url, "a"), chat(url, "b")]
    text = log_of(out, "case2")
    fails = failed_starts(text)
    made_room = "stopping a: making room for b" in text
    print(f"  statuses {statuses}, failed starts {fails}, a stopped first: {made_room}")
    return statuses == [200, 200] and fails == 0 and made_room


def case3(out: Path, gpu: int) -> bool:
    print("case 3: a model trained for 2,048 tokens under context 512-4096")
    m = model(out, "m2k", "--layers", "4", "--size-mb", "50", "--ctx", "2048")
    body = backend("short", m, "context = { min = 512, max = 4096 }", "-c", "{context}")
    with yard(out, "case3", body, gpu) as url:
        status = chat(url, "short")
        listed = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
    print(f"  status {status}; /v1/models context {listed['context']}")
    return status == 200 and listed["context"] == 2048


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="logs and models (default: temp)")
    args = parser.parse_args()
    global GPU
    GPU = f"gpu{args.gpu}"
    out = args.out or Path(tempfile.mkdtemp(prefix="yard-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results = {name: case(out, args.gpu) for name, case in
               (("case 1", case1), ("case 2", case2), ("case 3", case3))}  # fmt: skip
    print(json.dumps(results), f"({time.monotonic() - t0:.0f} s; logs in {out})")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

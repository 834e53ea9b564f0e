"""Tokens per second of a tiny random-weight model in the real llama-server.

    .venv/bin/python scripts/tiny_llama_speed.py [--size-mb 5] [--layers 4] [--tokens 256]

Writes the model to a temporary directory, starts llama-server on a free
loopback port (2 slots, 2 threads), sends a few completions with ``ignore_eos``
so each is exactly ``--tokens`` long, and prints the load time, llama-server's
own generation speed (its ``timings``), and the client-side throughput with
one and with two requests at a time.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from yard.demo.llama_server import find_llama_server
from yard.demo.tinymodel import write_sized_llama


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _complete(client: httpx.Client, tokens: int) -> dict[str, float]:
    response = client.post(
        "/v1/completions",
        json={
            "model": "tiny",
            "prompt": "Once upon a time",
            "max_tokens": tokens,
            "ignore_eos": True,
        },
    )
    response.raise_for_status()
    timings: dict[str, float] = response.json()["timings"]
    return timings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=5.0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--requests", type=int, default=6)
    args = p.parse_args()
    binary = find_llama_server()
    if binary is None:
        print("llama-server not found: run `make demo-setup`", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        facts = write_sized_llama(
            Path(tmp) / "tiny.gguf", size_mb=args.size_mb, n_layers=args.layers
        )
        print(
            f"model: {facts.file_bytes / 1e6:.1f} MB, {facts.n_layers} layers × {facts.n_embd}, "
            f"vocabulary {facts.vocab_size}"
        )
        port = _free_port()
        argv = [str(binary), "--host", "127.0.0.1", "--port", str(port), "-m", str(facts.path)]
        argv += ["--alias", "tiny", "-c", "2048", "-np", "2", "--threads", "2"]
        started = time.monotonic()
        with (
            subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as server,
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client,
        ):
            try:
                while True:
                    try:
                        if client.get("/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if server.poll() is not None or time.monotonic() - started > 60:
                        print("llama-server did not become healthy", file=sys.stderr)
                        return 1
                    time.sleep(0.02)
                print(f"load: {time.monotonic() - started:.2f} s to /health 200")
                _complete(client, 8)  # warm-up
                t0 = time.monotonic()
                runs = [_complete(client, args.tokens) for _ in range(args.requests)]
                serial = time.monotonic() - t0
                server_speed = sum(r["predicted_per_second"] for r in runs) / len(runs)
                print(f"llama-server timings: {server_speed:.0f} tokens/s generation (mean)")
                total = args.tokens * args.requests
                print(f"one at a time: {total / serial:.0f} tokens/s end to end")
                with ThreadPoolExecutor(2) as pool:
                    t0 = time.monotonic()
                    list(pool.map(lambda _: _complete(client, args.tokens), range(args.requests)))
                    parallel = time.monotonic() - t0
                print(f"two at a time: {total / parallel:.0f} tokens/s end to end")
            finally:
                server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())

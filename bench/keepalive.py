"""Requests through yard to a real llama-server, with pauses around its
keep-alive timeout: ``python -m bench.keepalive``.

Issue 24's target: 10,000 requests, 0 answers of 502. llama.cpp's server
keeps an idle connection 5 s (``Keep-Alive: timeout=5``), then closes it; a
request yard writes on a pooled connection just as it closes is lost, and its
client got a 502 "connection broke" from a healthy backend.

It runs ``yard serve`` (a process) with one backend: llama.cpp's server with
a tiny model of random weights (written here, nothing downloaded), ``-np``
slots and as many HTTP threads, and yard's ``slots`` to match, so yard keeps
that many pooled connections to it. Then, in rounds: a pause, then one wave of
``--wave`` streamed completions at once (so each pooled connection is reused
after the pause). Pauses are drawn from ``--pause-low`` to ``--pause-high``
seconds (around the 5 s timeout), and one round in ten is a short pause
(0-2 s) where pooled connections are reused. Each request uses a fresh client
connection to yard, so only yard's side to the backend is pooled.

It prints the answers by status (target: 0 of 502, and every one 200), the
pauses, and how many requests followed a pause within 0.5 s of the timeout.
``--strict`` exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from yard.demo.tinymodel import write_sized_llama
from yard.supervisor.launcher import free_port

KEEP_ALIVE_S = 5.0  # cpp-httplib's default, which llama-server keeps


def _config(root: Path, slots: int) -> Path:
    model = root / "tiny-llama.gguf"
    write_sized_llama(model, size_mb=5)
    command = [
        "{llama_server}",
        *("--host", "{host}", "--port", "{port}", "--model", "{model_file}"),
        *("--alias", "{model}", "-c", str(64 * slots), "-np", str(slots)),
        *("--threads", "1", "--threads-http", str(slots + 4)),
    ]
    path = root / "yard.toml"
    path.write_text(
        f'[server]\ndata_dir = "{root / "data"}"\nstop_grace_s = 5\n\n'
        f'[backends.llm]\nmodels = ["tiny-llama"]\ncommand = {json.dumps(command)}\n'
        f'model_file = "{model}"\nhealth_path = "/health"\nslots = {slots}\n'
        "startup_timeout_s = 120\n"
    )
    return path


async def _healthy(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        while True:
            try:
                if (await client.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.2)


async def _one(url: str, statuses: collections.Counter[str], errors: list[str]) -> None:
    body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2, "stream": True}
    limits = httpx.Limits(max_keepalive_connections=0)
    try:
        async with (
            httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client,
            client.stream("POST", "/v1/completions", json=body) as response,
        ):
            text = (await response.aread()).decode("utf-8", "replace")
            statuses[str(response.status_code)] += 1
            if response.status_code != 200:
                errors.append(f"{response.status_code}: {text[:300]}")
    except httpx.HTTPError as exc:
        statuses["client error"] += 1
        errors.append(f"client error: {exc!r}")


@dataclass(frozen=True, slots=True)
class Figures:
    statuses: dict[str, int]
    errors: list[str]
    rounds: int
    near: int
    pause_min: float
    pause_max: float
    seconds: float


async def _run(args: argparse.Namespace, url: str) -> Figures:
    rng = random.Random(args.seed)
    statuses: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    near = 0
    pauses: list[float] = []
    sent = 0
    began = time.monotonic()
    while sent < args.requests:
        if rng.random() < 0.1:
            pause = rng.uniform(0.0, 2.0)
        else:
            pause = rng.uniform(args.pause_low, args.pause_high)
        pauses.append(pause)
        await trio.sleep(pause)
        wave = min(args.wave, args.requests - sent)
        near += wave if abs(pause - KEEP_ALIVE_S) <= 0.5 else 0
        async with trio.open_nursery() as nursery:
            for _ in range(wave):
                nursery.start_soon(_one, url, statuses, errors)
        sent += wave
        if args.progress and len(pauses) % 20 == 0:
            print(f"  {sent} sent, {dict(statuses)}", flush=True)
    return Figures(
        statuses=dict(statuses),
        errors=errors[:10],
        rounds=len(pauses),
        near=near,
        pause_min=min(pauses),
        pause_max=max(pauses),
        seconds=time.monotonic() - began,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keepalive", description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--wave", type=int, default=32, help="requests per round, and slots")
    parser.add_argument("--pause-low", type=float, default=4.0)
    parser.add_argument("--pause-high", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="yard-keepalive-") as tmp:
        root = Path(tmp)
        config = _config(root, args.wave)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve = ["serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
        with (root / "yard.log").open("wb") as log:
            yard = subprocess.Popen(
                [sys.executable, "-m", "yard.cli", *serve],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            trio.run(_healthy, url)
            figures = trio.run(_run, args, url)
        finally:
            os.killpg(yard.pid, signal.SIGTERM)
            try:
                yard.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(yard.pid, signal.SIGKILL)
                yard.wait()
    statuses = figures.statuses
    total = sum(statuses.values())
    bad = statuses.get("502", 0)
    print(
        f"{total} requests through yard to llama-server in {figures.rounds} rounds of "
        f"{args.wave}, {figures.seconds:.0f} s (seed {args.seed})"
    )
    print(
        f"  pauses {figures.pause_min:.2f}-{figures.pause_max:.2f} s around its "
        f"{KEEP_ALIVE_S:.0f} s keep-alive; {figures.near} requests after a pause within "
        "0.5 s of it"
    )
    print(f"  answers by status: {statuses}; 502: {bad} (target 0)")
    for line in figures.errors:
        print(f"  {line}")
    met = bad == 0 and statuses.get("200", 0) == total
    print("  target met" if met else "  TARGET MISSED")
    return 0 if met or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())

"""Stops of a real ``yard serve``: ``python -m bench.stops`` (part of ``make bench``).

Each run starts ``yard serve`` with two test backends (each with a child
process in its group; one ignores SIGTERM, so only SIGKILL ends it), sends a
request to each (they load side by side: their profiles are stored before
the first run), waits a random short time (in a fifth of the runs from the
requests, so that signals land while a backend loads; in the others from
both answers, so that both serve), then sends SIGTERM, waits
a random short time again, and sends a second SIGTERM: what ``kill`` of
``make serve``'s process group does.

Afterwards it counts the processes left behind: every process that carries
the run's marker in its environment (backends inherit yard's), whatever its
group or parent. The target is 0 over every run; yard must also have exited
by itself (bounded wait). Leftovers are killed before the next run.

``--runs`` (default 50) and ``--seed`` (printed; the same seed gives the same
delays) choose the runs; ``--strict`` exits 1 when anything was left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import trio

from yard.config import load_config
from yard.core.spec import Profile
from yard.memory import default_meter
from yard.memory.profiles import open_profile_store
from yard.testing.backend import backend_command

MARKER = "YARD_BENCH_STOPS_RUN"
"""The environment variable that marks every process of one run."""

EXIT_WAIT_S = 60.0
"""How long yard may take to exit after the second signal before it counts as hung."""

MODELS = ("a", "b")

LOADING_SHARE = 0.2
"""The share of runs signalled while the backends may still be loading; the
others are signalled once both have answered."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(root: Path, port: int) -> Path:
    text = (
        f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "{root / "data"}"\n'
        'log_level = "warning"\nstop_grace_s = 2\n\n'
    )
    for name, switches in (
        ("a", {"child": True, "load_time": 0.3}),
        ("b", {"child": True, "load_time": 0.3, "ignore_sigterm": True}),
    ):
        argv = backend_command(**switches)
        text += (
            f"[backends.{name}]\ncommand = {json.dumps(argv)}\nmodels = [{json.dumps(name)}]\n"
            "startup_timeout_s = 30\nstop_grace_s = 5\n\n"
        )
    path = root / "yard.toml"
    path.write_text(text)
    return path


async def _store_profiles(config: Path) -> None:
    logging.getLogger("yard").setLevel(logging.ERROR)  # the meter's host-only notice
    loaded = load_config(config)
    meter = default_meter()
    try:
        store = await open_profile_store(loaded, devices=meter.describe())
        for name in MODELS:
            await store.put(name, Profile(gpu_bytes=0, host_bytes=64 * 2**20, load_s=0.5))
        await store.aclose()
    finally:
        meter.close()


def _marked(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``MARKER=marker``."""
    wanted = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in environ.split(b"\0") and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 60.0) -> None:
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"yard exited with {proc.returncode} before it served")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url + "/healthz", timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError("yard did not serve within a minute")


def _ask(url: str, model: str) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body.encode(),
        headers={"content-type": "application/json"},
    )
    # Cut or refused by the stop: that is what is being measured.
    with contextlib.suppress(OSError, urllib.error.HTTPError):
        urllib.request.urlopen(request, timeout=30).read()


def one_stop(
    root: Path, config: Path, port: int, rng: random.Random, run: int
) -> dict[str, object]:
    """One start, load and double SIGTERM; what was left afterwards."""
    marker = f"{os.getpid()}-{run}"
    env = {**os.environ, MARKER: marker}
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "yard.cli", "serve", "--config", str(config)]
    with (root / "yard.log").open("ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(url, proc)
        askers = [threading.Thread(target=_ask, args=(url, m), daemon=True) for m in MODELS]
        for asker in askers:
            asker.start()
        if rng.random() < LOADING_SHARE:
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            for asker in askers:
                asker.join(30)
            time.sleep(rng.uniform(0.0, 0.5))
        backends = len(_marked(marker)) - 1  # yard itself carries the marker
        proc.send_signal(signal.SIGTERM)
        time.sleep(rng.uniform(0.0, 0.5))
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            code: int | None = proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - signalled
        for asker in askers:
            asker.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = _marked(marker)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return {"code": code, "left": len(left), "backends": backends, "took_s": took}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stops", description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--strict", action="store_true", help="exit 1 when anything was left")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="yard-bench-stops-") as tmp:
        root = Path(tmp)
        port = _free_port()
        config = _config(root, port)
        trio.run(_store_profiles, config)
        for run in range(args.runs):
            results.append(one_stop(root, config, port, rng, run))
    left = sum(int(str(r["left"])) for r in results)
    hung = sum(1 for r in results if r["code"] is None)
    codes: dict[str, int] = {}
    for r in results:
        codes[str(r["code"])] = codes.get(str(r["code"]), 0) + 1
    loaded = [int(str(r["backends"])) for r in results]
    took = sorted(float(str(r["took_s"])) for r in results)
    print(f"stops: {len(results)} SIGTERM-then-SIGTERM stops of yard serve (seed {seed})")
    print(
        f"  backend processes when signalled: {min(loaded)} to {max(loaded)} "
        f"(median {statistics.median(loaded):g}; 4 = both backends and their children)"
    )
    print(f"  yard's exit codes: {codes}; hung (no exit in {EXIT_WAIT_S:g} s): {hung}")
    print(
        f"  time from the second signal to exit: median {statistics.median(took):.2f} s, "
        f"max {took[-1]:.2f} s"
    )
    verdict = "met" if left == 0 and hung == 0 else "MISSED"
    print(f"  processes left behind: {left} (target 0: {verdict})")
    return 1 if args.strict and verdict != "met" else 0


if __name__ == "__main__":
    sys.exit(main())

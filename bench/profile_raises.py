"""Profile-raise lines in the demo's first minutes: ``python -m bench.profile_raises``.

Runs ``yard serve`` with ``config/demo.toml`` as ``make serve`` does, but on a
free port and a fresh data directory (no stored profile: every first load is
measured, as on a new machine), with the demo's tiny llama model. A light
client asks each model in turn (the llm every 15 s, speech every 30 s, the
image server every 60 s) for ``--minutes`` (10 by default), then counts the
"profile raised" lines of yard's log at INFO and above, per backend, next to
its loads.

Before issue 22 the demo logged 17 raises in its first 3 minutes ("0.0 GiB
above 0.0 GiB"). Target: at most one per backend per load. Exit status 0 when
met.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.context_model import YARD
from yard.supervisor.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]
KEY = {"Authorization": "Bearer sk-announcer"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_raises", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="yard-raises-") as tmp:
        work = Path(tmp)
        (work / "data" / "models").mkdir(parents=True)
        subprocess.run(
            [sys.executable, "-m", "yard.demo.tinymodel",
             str(work / "data" / "models" / "tiny-llama.gguf"), "--size-mb", "5", "--layers", "4"],
            check=True, capture_output=True,
        )  # fmt: skip
        port = free_port()
        text = (ROOT / "config" / "demo.toml").read_text()
        text = text.replace('listen = "127.0.0.1:8080"', f'listen = "127.0.0.1:{port}"')
        text = text.replace('data_dir = "../.data"', f'data_dir = "{work / "data"}"')
        config = work / "demo.toml"
        config.write_text(text)
        for extra in (ROOT / "config").iterdir():
            if extra.is_dir():
                shutil.copytree(extra, work / extra.name)
        log_path = work / "yard.log"
        with log_path.open("wb") as log:
            yard = subprocess.Popen(
                [sys.executable, "-c", YARD, "serve", "--config", str(config)],
                stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        answers: Counter[str] = Counter()
        try:
            for _ in range(300):
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            end = time.monotonic() + args.minutes * 60
            tick = 0
            while time.monotonic() < end:
                asks = [("llm", "/v1/chat/completions",
                         {"model": "tiny-llama", "max_tokens": 16,
                          "messages": [{"role": "user", "content": "hello"}]})]  # fmt: skip
                if tick % 2 == 0:
                    speech = {"model": "tts-joe", "input": "Hello.", "voice": "joe"}
                    asks.append(("tts", "/v1/audio/speech", speech))
                if tick % 4 == 0:
                    asks.append(("images", "/v1/images/generations",
                                 {"model": "tiny-image", "prompt": "a cat"}))  # fmt: skip
                for name, path, body in asks:
                    try:
                        r = httpx.post(f"{url}{path}", json=body, headers=KEY, timeout=120)
                        answers[f"{name} {r.status_code}"] += 1
                    except httpx.HTTPError as exc:
                        answers[f"{name} {type(exc).__name__}"] += 1
                tick += 1
                time.sleep(15)
        finally:
            yard.terminate()
            yard.wait(120)
        log_text = log_path.read_text(errors="replace")
    raises: Counter[str] = Counter()
    loads: Counter[str] = Counter()
    for line in log_text.splitlines():
        m = re.search(r" (INFO|WARNING|ERROR) \S+: profile raised: (\S+):", line)
        if m:
            raises[m.group(2)] += 1
        m = re.search(r" INFO \S+: starting (\S+): ", line)
        if m:
            loads[m.group(1)] += 1
    print(f"{args.minutes:g} minutes of the demo; answers: {dict(answers)}")
    for name in sorted(set(loads) | set(raises)):
        print(f"  {name}: {loads[name]} load(s), {raises[name]} profile-raise line(s)")
    print(json.dumps({"loads": dict(loads), "raises": dict(raises)}))
    return 0 if all(raises[n] <= max(1, loads[n]) for n in raises) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Does yard shrink a context range to fit? ``python -m bench.context_fit``.

A generated llama model (``yard.demo.tinymodel``) behind a real ``llama-server``
whose context is ``{context}`` within ``context = { min = 1024, max = 8192 }``:

1. ``yard probe`` measures it at both ends and stores the line;
2. the host is limited (``[devices.host] reserve``) so that about half the
   range fits next to what this machine already uses: the maximum does not;
3. a real ``yard serve`` gets one completion. Checked: the start reason names
   the chosen context, llama-server's ``/props`` reports that ``n_ctx``, it is
   below the maximum and at least the minimum, the completion succeeds, and
   nothing ran out of memory (no such line in yard's or the backend's log);
4. a prompt far longer than the context it got is refused by llama-server
   with ``400`` "exceeds the available context size", passed through as it is.

Exit status 0 when all hold. Prints the figures. A minute or two on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from yard.supervisor.launcher import free_port

YARD = "import sys; from yard.cli import main; sys.exit(main())"
SPAN = (1024, 8192)
WRITE = ("--layers", "8", "--ctx", str(SPAN[1]), "--size-mb")
MARGIN = 1.1  # the scheduler's default profile_margin

CONFIG = """
[server]
listen = "127.0.0.1:{port}"
data_dir = "{data}"
stop_grace_s = 5

[devices.host]
reserve = "{reserve}B"

[backends.llm]
models = ["m"]
command = [
    "{{python}}", "-m", "yard.demo.llama_server", "--host", "{{host}}", "--port", "{{port}}",
    "--model", "{model}", "--alias", "m", "-c", "{{context}}", "-np", "1", "--threads", "2",
]
context = {{ min = {low}, max = {high} }}
health_path = "/health"
startup_timeout_s = 300
"""


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def post(url: str, body: object) -> object:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.context_fit", description=__doc__)
    parser.add_argument("--size-mb", type=int, default=32, help="the generated model's size")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="yard-fit-") as tmp:
        work = Path(tmp)
        model = work / "m.gguf"
        subprocess.run(
            [sys.executable, "-m", "yard.demo.tinymodel", str(model), *WRITE, str(args.size_mb)],
            check=True,
            capture_output=True,
        )
        config = work / "yard.toml"
        port = free_port()
        values = {"port": port, "data": work / "data", "model": model, "low": SPAN[0]}
        values["high"] = SPAN[1]
        config.write_text(CONFIG.format(reserve=0, **values))
        probe = subprocess.run(
            [sys.executable, "-c", YARD, "probe", "llm", "--config", str(config), "--json"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if probe.returncode != 0:
            print(probe.stderr[-3000:])
            return 1
        line = json.loads(probe.stdout)["context"]
        low, high = (line["points"][str(c)]["host_bytes"] for c in SPAN)
        # Room for the middle of the range: the maximum does not fit.
        room = int(MARGIN * (low + high) / 2)
        memory = psutil.virtual_memory()
        reserve = memory.total - (memory.total - memory.available) - room
        config.write_text(CONFIG.format(reserve=reserve, **values))
        log_path = work / "serve.log"
        with log_path.open("wb") as log:
            serve = subprocess.Popen(
                [sys.executable, "-c", YARD, "serve", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    get(base + "/healthz")
                    break
                except OSError:
                    time.sleep(0.2)
            answer = post(
                base + "/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 4}
            )
            models = get(base + "/v1/models")
            # A prompt longer than the context it got: llama-server's refusal
            # reaches the client as it is (no silent truncation).
            too_long = {"model": "m", "prompt": "hello world " * SPAN[1], "max_tokens": 4}
            try:
                post(base + "/v1/completions", too_long)
                refused = (200, "")
            except urllib.error.HTTPError as exc:
                refused = (exc.code, exc.read().decode(errors="replace"))
            backend_log = (work / "data" / "logs" / "llm.log").read_text()
            backend_port = int(re.findall(r"starting llm on port (\d+)", backend_log)[-1])
            props = get(f"http://127.0.0.1:{backend_port}/props")
        finally:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=60)
        text = log_path.read_text()
    assert isinstance(props, dict) and isinstance(models, dict) and isinstance(answer, dict)
    settings = props.get("default_generation_settings") or {}
    n_ctx = int(settings.get("n_ctx") or props.get("n_ctx") or 0)
    starts = [x for x in text.splitlines() if "starting llm" in x]
    chosen = int(re.findall(r"context (\d+) \(of", starts[-1])[0])
    listed = models["data"][0]["context"]
    ooms = text.lower().count("out of memory") + backend_log.lower().count("out of memory")
    print(f"probe: {low / 2**20:.1f} MiB at {SPAN[0]}, {high / 2**20:.1f} MiB at {SPAN[1]}")
    print(f"room left for it: {room / 2**20:.1f} MiB (host reserve {reserve / 2**30:.2f} GiB)")
    print(f"start: {starts[-1].split('INFO ', 1)[-1]}")
    print(f"/v1/models context {listed}, llama-server /props n_ctx {n_ctx}, OOM lines {ooms}")
    ok = SPAN[0] <= chosen < SPAN[1] and n_ctx == chosen == listed and ooms == 0
    ok = ok and bool(answer.get("choices"))
    print(f"a prompt of {2 * SPAN[1]:,} words: {refused[0]} {refused[1][:200]}")
    ok = ok and refused[0] == 400 and "exceeds the available context size" in refused[1]
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Parallel slots as an optional resource, on a real llama-server: ``python -m bench.parallel_fit``.

A generated llama model (``yard.demo.tinymodel``, nothing downloaded) behind a real
``llama-server`` started as ``-c {total_context} -np {parallel}`` (each slot gets the
whole ``{context}``), with ``context = { min = 2048, max = 8192 }`` and
``parallel = { min = 1, max = 4 }``:

1. ``yard probe`` measures it along the path starts are chosen on: (2048, 1), (8192, 1),
   (8192, 4), and stores the two lines;
2. the line in the slot count is checked against a third point it was not fitted on,
   (8192, 2) measured by its own probe (target: within 5 %); and the other form,
   ``-c 8192 -np 1`` against ``-c 8192 -np 4`` (the context split among the slots),
   shows memory that does not grow with the slots;
3. the host is limited (``[devices.host] reserve``) so that the context's maximum fits
   with one slot but the four slots do not; a real ``yard serve`` gets one completion.
   Checked: the start reason names context 8192 and the slots chosen, fewer than 4
   and at least 1; llama-server's ``/props`` reports that many slots; ``/v1/models``
   lists both; the completion succeeds; nothing ran out of memory.

Exit status 0 when all hold. Prints the figures. A few minutes on two cores. The room
is computed from the host's free memory just before ``yard serve`` starts; other
processes that take or free tens of MiB meanwhile move the choice by a slot (a slot is
about 70 MiB here, with the margin), and one that frees more than that lets all four fit.
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
from pathlib import Path

import psutil

from bench.context_fit import get, post
from yard.core.resources import need_at
from yard.core.spec import HOST, Profile
from yard.supervisor.launcher import free_port

YARD = "import sys; from yard.cli import main; sys.exit(main())"
CONTEXT = (2048, 8192)
SLOTS = (1, 4)
CHECK = 2
TARGET = 0.05
WRITE = ("--layers", "8", "--ctx", "8192", "--size-mb")
MARGIN = 1.1  # the scheduler's default profile_margin

HEAD = """
[server]
listen = "127.0.0.1:{port}"
data_dir = "{data}"
stop_grace_s = 5

[devices.host]
reserve = "{reserve}B"

[backends.llm]
models = ["m"]
health_path = "/health"
startup_timeout_s = 300
"""

RANGED = """command = [
    "{{python}}", "-m", "yard.demo.llama_server", "--host", "{{host}}", "--port", "{{port}}",
    "--model", "{model}", "--alias", "m", "-c", "{{total_context}}", "-np", "{{parallel}}",
    "--threads", "2",
]
context = {{ min = {c0}, max = {c1} }}
parallel = {{ min = {p0}, max = {p1} }}
"""

FIXED = """command = [
    "{{python}}", "-m", "yard.demo.llama_server", "--host", "{{host}}", "--port", "{{port}}",
    "--model", "{model}", "--alias", "m", "-c", "{c}", "-np", "{p}", "--threads", "2",
]
"""


def probe(config: Path, store: bool) -> dict[str, object]:
    """``yard probe llm --json`` on ``config``."""
    args = ["probe", "llm", "--config", str(config), "--json"]
    out = subprocess.run(
        [sys.executable, "-c", YARD, *args, *(() if store else ("--no-store",))],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"yard probe failed ({config.name}):\n{out.stderr[-3000:]}")
    report = json.loads(out.stdout)
    assert isinstance(report, dict)
    return report


def peak(report: dict[str, object]) -> int:
    devices = report["devices"]
    assert isinstance(devices, dict)
    return int(devices[HOST]["peak_bytes"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.parallel_fit", description=__doc__)
    parser.add_argument("--size-mb", type=int, default=16, help="the generated model's size")
    args = parser.parse_args(argv)
    mib = 2**20
    with tempfile.TemporaryDirectory(prefix="yard-parallel-") as tmp:
        work = Path(tmp)
        model = work / "m.gguf"
        subprocess.run(
            [sys.executable, "-m", "yard.demo.tinymodel", str(model), *WRITE, str(args.size_mb)],
            check=True,
            capture_output=True,
        )
        port = free_port()
        head = {"port": port, "data": work / "data"}
        ranged = RANGED.format(model=model, c0=CONTEXT[0], c1=CONTEXT[1], p0=SLOTS[0], p1=SLOTS[1])

        def write(name: str, body: str, reserve: int = 0) -> Path:
            path = work / name
            path.write_text(HEAD.format(reserve=reserve, **head) + body)
            return path

        # 1. the probe along the path, stored (yard serve starts from it)
        config = write("yard.toml", ranged)
        report = probe(config, True)
        slots = report["parallel"]
        assert isinstance(slots, dict)
        at_one, at_max = (int(slots["points"][str(p)]["host_bytes"]) for p in SLOTS)
        per_slot = float(slots["host_per_slot"] or 0.0)
        # 2. a third point, and the split form
        fixed = FIXED.format(model=model, c=CONTEXT[1] * CHECK, p=CHECK)
        third = peak(probe(write("check.toml", fixed), False))
        line = Profile(
            gpu_bytes=0,
            host_bytes=at_one,
            load_s=1,
            context=CONTEXT[1],
            parallel=SLOTS[0],
            gpu_per_slot=0.0,
            host_per_slot=per_slot,
        )
        predicted = need_at(line, (), 1.0, CONTEXT[1], CHECK)[HOST]
        error = (predicted - third) / third
        top = CONTEXT[1]
        split = [
            peak(probe(write(f"split{p}.toml", FIXED.format(model=model, c=top, p=p)), False))
            for p in SLOTS
        ]
        # 3. room for the context's maximum and about half the slots
        room = int(MARGIN * (at_one + at_max) / 2)
        memory = psutil.virtual_memory()
        reserve = memory.total - (memory.total - memory.available) - room
        write("yard.toml", ranged, reserve=reserve)
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
            backend_log = (work / "data" / "logs" / "llm.log").read_text()
            backend_port = int(re.findall(r"starting llm on port (\d+)", backend_log)[-1])
            props = get(f"http://127.0.0.1:{backend_port}/props")
        finally:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=60)
        text = log_path.read_text()
    assert isinstance(props, dict) and isinstance(models, dict) and isinstance(answer, dict)
    starts = [x for x in text.splitlines() if "starting llm" in x]
    context = int(re.findall(r"context (\d+) \(of", starts[-1])[0])
    chosen = int(re.findall(r"(\d+) slots? \(of", starts[-1])[0])
    listed = models["data"][0]
    total_slots = int(props.get("total_slots") or 0)
    ooms = text.lower().count("out of memory") + backend_log.lower().count("out of memory")
    print(
        f"probe at context {CONTEXT[1]}: {at_one / mib:.1f} MiB with 1 slot, "
        f"{at_max / mib:.1f} MiB with {SLOTS[1]}: {per_slot / mib:.2f} MiB per slot"
    )
    print(
        f"at {CHECK} slots: measured {third / mib:.1f} MiB, predicted {predicted / mib:.1f} MiB, "
        f"error {error * 100:+.2f} % (target within {TARGET * 100:.0f} %)"
    )
    print(
        f"-c {CONTEXT[1]} split among the slots: {split[0] / mib:.1f} MiB with 1, "
        f"{split[1] / mib:.1f} MiB with {SLOTS[1]}"
    )
    print(f"room left for it: {room / mib:.1f} MiB (host reserve {reserve / 2**30:.2f} GiB)")
    print(f"start: {starts[-1].split('INFO ', 1)[-1]}")
    print(
        f"/v1/models context {listed['context']} parallel {listed['parallel']}, "
        f"llama-server /props total_slots {total_slots}, OOM lines {ooms}"
    )
    ok = abs(error) <= TARGET and context == CONTEXT[1] and SLOTS[0] <= chosen < SLOTS[1]
    ok = ok and total_slots == chosen == listed["parallel"] and listed["context"] == context
    ok = ok and ooms == 0 and bool(answer.get("choices"))
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

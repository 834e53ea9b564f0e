"""Is the learned memory model of a context range right? ``python -m bench.context_model``.

For two generated llama models (``yard.demo.tinymodel``, nothing downloaded) it
measures a real ``llama-server`` with ``yard probe --json`` (start-up, warm-up and
a context-filling request, sampled every 200 ms) at three context sizes, learns
the line of :mod:`yard.core.resources` from the first two (the same
``learn``/``need_at`` the scheduler uses), and compares its prediction at the
third with what was measured there.

Target (issue 15): within 5 % of the measured footprint (host memory: this
machine has no GPU). Exit status 0 when every model meets it. Small models and
contexts, so a run takes a minute or two on two cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from yard.core.resources import learn, need_at
from yard.core.spec import HOST, Profile

MODELS = (("small", 8), ("large", 32))
"""(name, size in MB): two footprints, 8 layers each."""
FIT = (1024, 4096)
CHECK = 2560
TARGET = 0.05
YARD = "import sys; from yard.cli import main; sys.exit(main())"
WRITE = ("--layers", "8", "--ctx", "8192", "--size-mb")

CONFIG = """
[server]
data_dir = "{data}"

[backends.llm]
models = ["m"]
command = [
    "{{python}}", "-m", "yard.demo.llama_server", "--host", "{{host}}", "--port", "{{port}}",
    "--model", "{model}", "-c", "{context}", "-np", "1", "--threads", "2",
]
health_path = "/health"
startup_timeout_s = 120
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One model: what was measured at each context, the learned slope, and
    the prediction at :data:`CHECK` with its relative error."""

    model: str
    file_bytes: int
    measured: dict[int, int]
    per_token_bytes: float
    predicted: int
    error: float


def probe(work: Path, model: Path, context: int) -> int:
    """Peak host bytes of llama-server at ``context``, measured by ``yard probe``."""
    config = work / f"{model.stem}-{context}.toml"
    config.write_text(CONFIG.format(data=work / "data", model=model, context=context))
    probe_args = ["probe", "llm", "--config", str(config), "--json", "--no-store"]
    out = subprocess.run(
        [sys.executable, "-c", YARD, *probe_args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"yard probe failed at context {context}:\n{out.stderr[-2000:]}")
    report = json.loads(out.stdout)
    return int(report["devices"][HOST]["peak_bytes"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.context_model", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="yard-context-") as tmp:
        work = Path(tmp)
        for name, size_mb in MODELS:
            model = work / f"{name}.gguf"
            subprocess.run(
                [sys.executable, "-m", "yard.demo.tinymodel", str(model), *WRITE, str(size_mb)],
                check=True,
                capture_output=True,
            )
            measured = {c: probe(work, model, c) for c in (*FIT, CHECK)}
            profile: Profile | None = None
            for context in FIT:
                figure = measured[context]
                point = Profile(gpu_bytes=0, host_bytes=figure, load_s=1, context=context)
                profile = learn(profile, point)
            predicted = need_at(profile, (), 1.0, CHECK)[HOST]
            assert profile is not None
            rows.append(
                Row(
                    model=name,
                    file_bytes=model.stat().st_size,
                    measured=measured,
                    per_token_bytes=profile.host_per_token or 0.0,
                    predicted=predicted,
                    error=(predicted - measured[CHECK]) / measured[CHECK],
                )
            )
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
    else:
        for row in rows:
            figures = ", ".join(f"{c}: {b / 2**20:.1f} MiB" for c, b in row.measured.items())
            print(
                f"{row.model} ({row.file_bytes / 2**20:.1f} MiB file): measured {figures}; "
                f"{row.per_token_bytes / 1024:.1f} KiB per token; predicted at {CHECK}: "
                f"{row.predicted / 2**20:.1f} MiB, error {row.error * 100:+.2f} % "
                f"(target within {TARGET * 100:.0f} %)"
            )
    return 0 if all(abs(row.error) <= TARGET for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

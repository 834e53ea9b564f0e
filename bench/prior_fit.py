"""Is the prior read from a model file right? ``python -m bench.prior_fit``.

For three generated llama models (``yard.demo.tinymodel``, nothing downloaded)
it measures a real ``llama-server`` on the CPU with ``yard probe --json``
(start-up, warm-up and a context-filling request, sampled every 200 ms: the
peak a first load is profiled at) at three context sizes, and prints next to
each the prior :mod:`yard.memory.prior` gives from the file alone, through the
same ``prior_for`` that ``yard serve`` uses, and their difference.

Target (issue 22): the prior within 15 % of the measured peak everywhere.
Exit status 0 when every point meets it. Small models and contexts, so a run
takes a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.context_model import probe
from yard.core.resources import need_at
from yard.core.spec import HOST
from yard.memory.prior import prior_for

MODELS = (("small", 20), ("medium", 60), ("large", 150))
"""(name, size in MB), 8 layers each."""
CONTEXTS = (1024, 2048, 4096)
TARGET = 0.15
WRITE = ("--layers", "8", "--ctx", "32768", "--size-mb")
MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One model at one context: the measured peak, the prior, the error."""

    model: str
    file_bytes: int
    context: int
    measured: int
    prior: int
    error: float


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prior_fit", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="yard-prior-") as tmp:
        work = Path(tmp)
        for name, size_mb in MODELS:
            model = work / f"{name}.gguf"
            subprocess.run(
                [sys.executable, "-m", "yard.demo.tinymodel", str(model), *WRITE, str(size_mb)],
                check=True,
                capture_output=True,
            )
            for context in CONTEXTS:
                measured = probe(work, model, context)
                # the server's arguments as bench.context_model's CONFIG gives them
                server_argv = ["--model", str(model), "-c", str(context), "-np", "1"]
                estimate = prior_for(server_argv, None, None, on_gpu=False)
                assert estimate is not None
                predicted = need_at(estimate.profile, (), 1.0, context)[HOST]
                points.append(
                    Point(
                        model=name,
                        file_bytes=model.stat().st_size,
                        context=context,
                        measured=measured,
                        prior=predicted,
                        error=(predicted - measured) / measured,
                    )
                )
                p = points[-1]
                if not args.json:
                    print(
                        f"{p.model} ({p.file_bytes / MIB:.0f} MiB file) at {p.context}: "
                        f"measured {p.measured / MIB:.1f} MiB, prior {p.prior / MIB:.1f} MiB, "
                        f"{p.error * 100:+.1f} % (target within {TARGET * 100:.0f} %)",
                        flush=True,
                    )
    if args.json:
        print(json.dumps([asdict(p) for p in points], indent=2))
    else:
        worst = max(points, key=lambda p: abs(p.error))
        print(f"worst: {worst.model} at {worst.context}: {worst.error * 100:+.1f} %")
    return 0 if all(abs(p.error) <= TARGET for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The proxy benchmark: ``make bench`` / ``python -m bench``.

It runs the real ``yard serve`` (one backend: the minimal upstream of
:mod:`yard.testing.fake`, started and health-checked by yard itself) and, beside
it, a second instance of the same upstream reached directly. Both are driven
by the same load generator in separate processes (``wrk`` when it is
installed, else :mod:`bench.load`), rounds interleaved so that a noisy
neighbour hurts both sides alike, and it prints:

- added latency at concurrency 1 (p50, p99): yard minus direct;
- requests per second at concurrency 16, through yard and direct;
- time to the first byte of a stream (and to its first event), through yard
  and direct;
- whether anything is held back: each streamed event carries its send time;
  the lag to the client and the gaps between events show buffering.

Targets (checked and printed, never lowered): at least 2,000 req/s through
yard at concurrency 16; at most 0.5 ms added p50 at concurrency 1; the first
stream byte within 1 ms of direct; no buffering.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
STREAM_EVENTS = 10
STREAM_INTERVAL_MS = 20

TARGET_RPS = 2000.0
TARGET_ADDED_P50_MS = 0.5
TARGET_TTFB_MS = 1.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, deadline_s: float = 60.0) -> None:
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {deadline_s} s")


def _post(url: str) -> None:
    request = urllib.request.Request(
        url,
        data=b'{"model":"bench","messages":[]}',
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def _load(*args: str) -> object:
    out = subprocess.run(
        [PY, "-m", "bench.load", *args], cwd=ROOT, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _wrk(url: str, connections: int, seconds: float, script: Path) -> float:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", str(script), url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(f"wrk printed no rate:\n{out}")


def _cpu_s(pid: int) -> float:
    """CPU time (user + system) the process has used, in seconds (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _throughput(
    url: str, seconds: float, script: Path, use_wrk: bool, pid: int
) -> tuple[float, float]:
    """(requests per second, CPU µs the process at ``pid`` spent per request)."""
    cpu0 = _cpu_s(pid)
    if use_wrk:
        rate = _wrk(url, 16, seconds, script)
        elapsed = float(max(1, round(seconds)))
    else:
        result = _load("throughput", url, "--connections", "16", "--seconds", str(seconds))
        assert isinstance(result, dict)
        elapsed = float(result["seconds"])
        rate = float(result["requests"]) / elapsed
    cpu = _cpu_s(pid) - cpu0
    return rate, cpu / (rate * elapsed) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000, help="per latency round")
    parser.add_argument("--seconds", type=float, default=4.0, help="per throughput round")
    parser.add_argument("--no-wrk", action="store_true", help="use bench.load even if wrk exists")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    use_wrk = shutil.which("wrk") is not None and not args.no_wrk

    work = Path(tempfile.mkdtemp(prefix="yard-bench-"))
    direct_proc = subprocess.Popen(
        [PY, "-m", "yard.testing.fake", "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    yard_proc: subprocess.Popen[bytes] | None = None
    try:
        assert direct_proc.stdout is not None
        direct_base = direct_proc.stdout.readline().split()[-1]
        port = _free_port()
        command = [PY, "-m", "yard.testing.fake", "--port", "{port}"]
        config = work / "yard.toml"
        config.write_text(
            f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "{work / "data"}"\n'
            f'log_level = "warning"\n\n'
            f'[backends.bench]\nmodels = ["bench"]\ncommand = {json.dumps(command)}\n'
            f'cwd = "{ROOT}"\nslots = 64\nhealth_path = "/health"\n'
        )
        yard_proc = subprocess.Popen(
            [PY, "-m", "yard.cli", "serve", "--config", str(config)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=(work / "yard.log").open("wb"),
        )
        yard_base = f"http://127.0.0.1:{port}"
        _wait_http(yard_base + "/healthz")
        _post(yard_base + "/v1/chat/completions")  # loads (and measures) the backend
        small = "/v1/chat/completions"
        stream_path = f"/v1/stream?n={STREAM_EVENTS}&ms={STREAM_INTERVAL_MS}"
        script = work / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            'wrk.body = \'{"model":"bench","messages":[{"role":"user","content":"hi"}]}\'\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )

        lat: dict[str, list[float]] = {"direct": [], "yard": []}
        rps: dict[str, list[float]] = {"direct": [], "yard": []}
        cpu: dict[str, list[float]] = {"direct": [], "yard": []}
        ttfb: dict[str, list[float]] = {"direct": [], "yard": []}
        tfe: dict[str, list[float]] = {"direct": [], "yard": []}
        lag: dict[str, list[float]] = {"direct": [], "yard": []}
        gaps: dict[str, list[float]] = {"direct": [], "yard": []}
        bases = {"direct": direct_base, "yard": yard_base}
        pids = {"direct": direct_proc.pid, "yard": yard_proc.pid}
        for _ in range(args.rounds):
            # Each phase starts on a settled machine (the throughput phase
            # leaves 16 connections closing behind it).
            for side, base in bases.items():
                time.sleep(0.5)
                result = _load("stream", base + stream_path, "--runs", "20")
                assert isinstance(result, dict)
                ttfb[side] += result["ttfb_us"]
                tfe[side] += result["first_event_us"]
                lag[side] += result["lag_us"]
                gaps[side] += result["gap_us"]
            for side, base in bases.items():
                time.sleep(0.5)
                values = _load("latency", base + small, "--requests", str(args.requests))
                assert isinstance(values, list)
                lat[side] += values
            for side, base in bases.items():
                time.sleep(0.5)
                rate, cpu_us = _throughput(base + small, args.seconds, script, use_wrk, pids[side])
                rps[side].append(rate)
                cpu[side].append(cpu_us)
    finally:
        if yard_proc is not None:
            yard_proc.send_signal(signal.SIGTERM)
            try:
                yard_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                yard_proc.kill()
        direct_proc.kill()
        direct_proc.wait()
        shutil.rmtree(work, ignore_errors=True)

    def ms(us: float) -> str:
        return f"{us / 1000.0:.3f} ms"

    p50 = {s: _percentile(v, 0.50) for s, v in lat.items()}
    p99 = {s: _percentile(v, 0.99) for s, v in lat.items()}
    mean_rps = {s: statistics.mean(v) for s, v in rps.items()}
    t50 = {s: _percentile(v, 0.50) for s, v in ttfb.items()}
    e50 = {s: _percentile(v, 0.50) for s, v in tfe.items()}
    lag50 = {s: _percentile(v, 0.50) for s, v in lag.items()}
    lag_max = {s: max(v) for s, v in lag.items()}
    gap_mid = {s: _percentile(v, 0.50) for s, v in gaps.items()}
    added_p50 = p50["yard"] - p50["direct"]
    added_p99 = p99["yard"] - p99["direct"]
    added_ttfb = t50["yard"] - t50["direct"]
    # Buffering would show as events arriving together (gaps far below the
    # interval) or late (a lag of the order of the interval).
    # (Medians, so that one event delayed by a busy host does not count.)
    interval_us = STREAM_INTERVAL_MS * 1000
    buffered = gap_mid["yard"] < 0.5 * interval_us or lag50["yard"] > 0.5 * interval_us
    load = os.getloadavg()
    print(
        f"yard proxy benchmark: {args.rounds} rounds, load generator: "
        f"{'wrk' if use_wrk else 'bench.load'}; {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print(f"{'':34}{'direct':>12}{'yard':>12}{'yard/direct':>13}")
    rows = [
        (
            "latency p50, concurrency 1",
            ms(p50["direct"]),
            ms(p50["yard"]),
            p50["yard"] / p50["direct"],
        ),
        (
            "latency p99, concurrency 1",
            ms(p99["direct"]),
            ms(p99["yard"]),
            p99["yard"] / p99["direct"],
        ),
        (
            "req/s, concurrency 16",
            f"{mean_rps['direct']:.0f}",
            f"{mean_rps['yard']:.0f}",
            mean_rps["yard"] / mean_rps["direct"],
        ),
        ("stream first byte p50", ms(t50["direct"]), ms(t50["yard"]), t50["yard"] / t50["direct"]),
        ("stream first event p50", ms(e50["direct"]), ms(e50["yard"]), e50["yard"] / e50["direct"]),
        (
            "stream event lag p50",
            ms(lag50["direct"]),
            ms(lag50["yard"]),
            lag50["yard"] / lag50["direct"],
        ),
        (
            "stream event lag max",
            ms(lag_max["direct"]),
            ms(lag_max["yard"]),
            lag_max["yard"] / lag_max["direct"],
        ),
        (
            "stream gap between events p50",
            ms(gap_mid["direct"]),
            ms(gap_mid["yard"]),
            gap_mid["yard"] / gap_mid["direct"],
        ),
    ]
    for name, direct, yard, ratio in rows:
        print(f"{name:34}{direct:>12}{yard:>12}{ratio:>12.2f}x")
    # (Two events read in one recv count as a gap of 0 on either side.)
    print(
        f"added latency: p50 {ms(added_p50)}, p99 {ms(added_p99)}; "
        f"added first stream byte: {ms(added_ttfb)}"
    )
    print(
        f"per-round req/s: direct {[round(r) for r in rps['direct']]}, "
        f"yard {[round(r) for r in rps['yard']]}"
    )
    yard_cpu = statistics.median(cpu["yard"])
    print(
        f"CPU per request at concurrency 16 (user+system, whole process): yard {yard_cpu:.0f} us "
        f"(a free core would carry about {1e6 / yard_cpu:.0f} req/s); direct upstream "
        f"{statistics.median(cpu['direct']):.0f} us"
    )
    verdicts = [
        (f"yard >= {TARGET_RPS:.0f} req/s at concurrency 16", mean_rps["yard"] >= TARGET_RPS),
        (
            f"added p50 <= {TARGET_ADDED_P50_MS} ms at concurrency 1",
            added_p50 <= TARGET_ADDED_P50_MS * 1000,
        ),
        (
            f"first stream byte within {TARGET_TTFB_MS} ms of direct",
            added_ttfb <= TARGET_TTFB_MS * 1000,
        ),
        (
            f"stream not buffered ({STREAM_EVENTS} events {STREAM_INTERVAL_MS} ms apart)",
            not buffered,
        ),
    ]
    for text, ok in verdicts:
        print(f"  {'PASS' if ok else 'MISS'}  {text}")
    return 1 if args.strict and not all(ok for _, ok in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())

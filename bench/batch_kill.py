"""A batch through SIGKILLs: ``python -m bench.batch_kill``.

It starts ``yard serve`` (one test backend, two slots, each answer taking
``--service-s``, every request it receives written to a counter file with the
job id yard sends), hands in one batch of ``--lines`` chat requests with the
Batch API, then SIGKILLs yard ``--kills`` times at random moments (a quarter
of them during start-up and restore, the others a random time after it
answers ``/healthz`` and lines run again, within two service times),
restarting it each time on the same data directory.
Then it lets yard finish the batch and checks its output and error files:

- lost: input lines in neither file (target 0);
- duplicated: lines in the files more than once (target 0);
- run twice: lines the backend received more than once (target 0; with
  ``--rerun-safe``, a line interrupted by a kill may run once more). The
  backend is the test backend, writing each request's job id to a file as it
  arrives (before its service time), so a run cut short by a kill counts;
- completed without a run: output lines whose request never reached it;
- format: every output line is OpenAI's ``{id, custom_id, response:
  {status_code, request_id, body}, error: null}``, every error line has
  ``response`` or ``error: {code, message}``.

Lines that were running when yard died end in the error file as
``interrupted`` (yard never runs a request twice on its own); every other
line completes. ``--seed`` (printed) replays the same moments; ``--strict``
exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h11
import httpx
import trio

from yard.testing.backend import Backend, Options, Request, backend_command, parse_args

KEY = "sk-bench-batch"
ROOT = Path(__file__).resolve().parents[1]
EARLY_SHARE = 0.25
HEALTHY_WITHIN_S = 60.0
RUNNING_WITHIN_S = 10.0  # after a restart, lines run again within this
FINISH_WITHIN_S = 300.0
ENDED = ("completed", "failed", "expired", "cancelled")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _CountingBackend(Backend):
    """The test backend, writing each request's job id to ``receipts`` as it
    arrives (the test backend's own counter writes it once it has answered)."""

    def __init__(self, options: Options, receipts: str) -> None:
        super().__init__(options)
        # One small append per request (O_APPEND: whole lines, even from two slots).
        self._receipts = os.open(receipts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def api(self, stream: trio.SocketStream, conn: h11.Connection, req: Request) -> None:
        os.write(self._receipts, req.headers.get("x-yard-request-id", "?").encode() + b"\n")
        await super().api(stream, conn, req)


async def _serve_backend(options: Options, receipts: str) -> None:
    backend = _CountingBackend(options, receipts)
    listeners = await trio.open_tcp_listeners(options.port, host=options.host)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backend.load)
        await trio.serve_listeners(backend.serve_connection, listeners)


def _config(work: Path, port: int, service_s: float) -> Path:
    python, _, _, *switches = backend_command(service_time=service_s)
    argv = [python, "-m", "bench.batch_kill", "--serve-backend", str(work / "served.txt")]
    path = work / "yard.toml"
    path.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "{work / "data"}"\n'
        "stop_grace_s = 1\n\n"
        f"[backends.llm]\ncommand = {json.dumps(argv + switches)}\n"
        f'models = ["tiny"]\nslots = 2\ncwd = {json.dumps(str(ROOT))}\n'
        "startup_timeout_s = 30\n\n"
        f'[apps.bench]\nkey = "{KEY}"\ndefault_priority = 50\nmax_priority = 80\n'
    )
    return path


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "yard.cli", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill(process: subprocess.Popen[bytes], data_dir: Path) -> None:
    """SIGKILL yard, then the backends it left (as a crash would leave them)."""
    process.kill()
    process.wait()
    for pid_file in (data_dir / "run").glob("*.pid"):
        try:
            os.killpg(int(json.loads(pid_file.read_text())["pgid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError, TypeError):
            continue


def _wait_healthy(client: httpx.Client) -> None:
    deadline = time.monotonic() + HEALTHY_WITHIN_S
    while time.monotonic() < deadline:
        try:
            if client.get("/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"yard did not answer /healthz within {HEALTHY_WITHIN_S:g} s")


def _wait_received(receipts: Path) -> None:
    """Return once the backend receives another request (or after RUNNING_WITHIN_S)."""
    before = receipts.stat().st_size if receipts.exists() else 0
    deadline = time.monotonic() + RUNNING_WITHIN_S
    while time.monotonic() < deadline:
        if receipts.exists() and receipts.stat().st_size > before:
            return
        time.sleep(0.01)


def _batch_status(client: httpx.Client, batch_id: str) -> dict[str, Any] | None:
    try:
        response = client.get(f"/v1/batches/{batch_id}", timeout=5.0)
    except httpx.TransportError:
        return None
    batch: dict[str, Any] = response.json()
    return batch


def _lines(client: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    response = client.get(f"/v1/files/{file_id}/content", timeout=30.0)
    response.raise_for_status()
    return [json.loads(line) for line in response.content.splitlines()]


def _format_ok(line: dict[str, Any], *, output: bool) -> bool:
    if set(line) != {"id", "custom_id", "response", "error"}:
        return False
    if not str(line["id"]).startswith("batch_req_"):
        return False
    response, error = line["response"], line["error"]
    if output:
        return (
            error is None
            and isinstance(response, dict)
            and set(response) == {"status_code", "request_id", "body"}
            and response["status_code"] == 200
        )
    if error is not None:
        return response is None and set(error) == {"code", "message"}
    return isinstance(response, dict) and response["status_code"] >= 400


def run(*, lines: int, kills: int, seed: int, service_s: float, rerun_safe: bool) -> dict[str, Any]:
    """One run; returns the figures."""
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="yard-batch-kill-"))
    port = _free_port()
    config = _config(work, port, service_s)
    data_dir = work / "data"
    started = time.monotonic()
    custom_ids = [f"line-{i:04d}" for i in range(lines)]
    content = b"".join(
        json.dumps(
            {
                "custom_id": cid,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "tiny", "messages": [{"role": "user", "content": cid}]},
            }
        ).encode()
        + b"\n"
        for cid in custom_ids
    )
    headers = {"authorization": f"Bearer {KEY}"}
    process = _start(config, work / "yard-0.log")
    in_progress_kills = 0
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
            _wait_healthy(client)
            uploaded = client.post(
                "/v1/files",
                files={"file": ("batch.jsonl", content, "application/jsonl")},
                data={"purpose": "batch"},
            ).json()
            extra = {"prefer": "rerun-safe"} if rerun_safe else {}
            batch = client.post(
                "/v1/batches",
                json={
                    "input_file_id": uploaded["id"],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
                headers=extra,
            ).json()
            batch_id = batch["id"]
            for kill in range(kills):
                if kill > 0:
                    process = _start(config, work / f"yard-{kill}.log")
                    if rng.random() < EARLY_SHARE:
                        time.sleep(rng.uniform(0.0, 1.2))
                        _kill(process, data_dir)
                        continue
                    _wait_healthy(client)
                # Then until lines run again (the backend, killed with yard,
                # loads anew), and a random moment of their service after that.
                _wait_received(work / "served.txt")
                time.sleep(rng.uniform(0.0, 2 * service_s))
                seen = _batch_status(client, batch_id)
                if seen is not None and seen["status"] not in ENDED:
                    in_progress_kills += 1
                _kill(process, data_dir)
            process = _start(config, work / "yard-final.log")
            _wait_healthy(client)
            deadline = time.monotonic() + FINISH_WITHIN_S
            while True:
                batch = _batch_status(client, batch_id) or {"status": "?"}
                if batch["status"] in ENDED:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the batch is still {batch['status']}")
                time.sleep(0.1)
            output = _lines(client, batch.get("output_file_id"))
            errors = _lines(client, batch.get("error_file_id"))
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            _kill(process, data_dir)
    served_file = work / "served.txt"
    served = served_file.read_text().split() if served_file.exists() else []
    runs = collections.Counter(served)
    found = collections.Counter(line["custom_id"] for line in output + errors)
    # A line's job id and output id share its index: job_<hex>_<i> / batch_req_<hex>_<i>.
    index_of = {line["id"].rsplit("_", 1)[1]: line["custom_id"] for line in output + errors}
    ran: collections.Counter[str] = collections.Counter()
    strangers = 0
    for job_id, n in runs.items():
        cid = index_of.get(job_id.rsplit("_", 1)[1]) if job_id.startswith("job_") else None
        if cid is None:
            strangers += n
        else:
            ran[cid] += n
    codes = collections.Counter(
        line["error"]["code"] if line["error"] else f"http_{line['response']['status_code']}"
        for line in errors
    )
    allowed = 2 if rerun_safe else 1
    return {
        "seed": seed,
        "lines": lines,
        "kills": kills,
        "kills_while_in_progress": in_progress_kills,
        "status": batch["status"],
        "request_counts": batch.get("request_counts"),
        "completed": len(output),
        "error_codes": dict(codes),
        "lost": sum(1 for cid in custom_ids if found[cid] == 0),
        "duplicated": sum(1 for n in found.values() if n > 1),
        "run_twice": sum(1 for n in ran.values() if n > allowed),
        "rerun_once": sum(1 for n in ran.values() if n == 2) if rerun_safe else 0,
        "completed_not_run": sum(1 for line in output if ran[line["custom_id"]] == 0),
        "interrupted_that_reached_the_backend": sum(
            1
            for line in errors
            if line["error"] and line["error"]["code"] == "interrupted" and ran[line["custom_id"]]
        ),
        "backend_runs_of_unknown_jobs": strangers,
        "format_errors": sum(1 for line in output if not _format_ok(line, output=True))
        + sum(1 for line in errors if not _format_ok(line, output=False)),
        "seconds": round(time.monotonic() - started, 1),
        "work_dir": str(work),
    }


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--serve-backend"]:
        # The backend yard starts: --serve-backend RECEIPTS, then the test backend's switches.
        trio.run(_serve_backend, parse_args(args_in[2:]), args_in[1])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.batch_kill", description=__doc__)
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--service-s", type=float, default=0.15)
    parser.add_argument("--rerun-safe", action="store_true")
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args(args_in)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    figures = run(
        lines=args.lines,
        kills=args.kills,
        seed=seed,
        service_s=args.service_s,
        rerun_safe=args.rerun_safe,
    )
    ok = (
        figures["lost"] == 0
        and figures["duplicated"] == 0
        and figures["run_twice"] == 0
        and figures["completed_not_run"] == 0
        and figures["backend_runs_of_unknown_jobs"] == 0
        and figures["format_errors"] == 0
        and figures["completed"] + sum(figures["error_codes"].values()) == figures["lines"]
    )
    print(f"batch_kill: {figures['lines']} lines, {figures['kills']} SIGKILLs (seed {seed})")
    print(json.dumps(figures, indent=2))
    print(
        f"target (0 lost, 0 run twice, files complete and in OpenAI's format): "
        f"{'met' if ok else 'MISSED'}"
    )
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())

"""A large stored file downloaded while yard serves: ``python -m bench.file_content``.

A Batch API file (``GET /v1/files/ID/content``) of ``--mb`` MB (55 by default,
the size of a big batch's output) is read from yard's SQLite database and
sent to a client, all while yard's Trio loop serves everyone else. The
figure is how late a task that sleeps 1 ms over and over woke at worst: what
any other request (``/healthz`` included) waited meanwhile, whatever held the
loop (a step, the GIL held by a worker thread, the OS).

It runs yard in this process as ``yard serve`` does, stores the file, and in
each run measures, one after the other:

1. baseline: the worst lateness over one second with yard idle (this
   machine's own noise, measured in the same run);
2. one read: the file read back as one value, ``SELECT body`` (what yard did
   before it read files a piece at a time), for reference;
3. download: the file downloaded by a client in another process (``urllib``),
   checked by its SHA-256.

With ``--runs N`` it prints the median of N runs and their range, with the
machine's load average.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import trio

from bench.batch_big import figure
from yard.app.serve import serve
from yard.batches.service import Batches
from yard.config import load_config
from yard.testing.backend import backend_command

KEY = "sk-bench"
_CLIENT = """
import hashlib, sys, urllib.request
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
digest, size = hashlib.sha256(), 0
with urllib.request.urlopen(request) as answer:
    while piece := answer.read(1 << 20):
        digest.update(piece)
        size += len(piece)
print(size, digest.hexdigest())
"""
_UPLOAD = """
import json, sys, urllib.request
content = sys.stdin.buffer.read()
head = (
    b'--b\\r\\nContent-Disposition: form-data; name="purpose"\\r\\n\\r\\nbatch\\r\\n'
    b'--b\\r\\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\\r\\n'
    b'Content-Type: application/jsonl\\r\\n\\r\\n'
)
request = urllib.request.Request(
    sys.argv[1],
    data=head + content + b'\\r\\n--b--\\r\\n',
    headers={"Authorization": "Bearer " + sys.argv[2],
             "Content-Type": "multipart/form-data; boundary=b"},
)
with urllib.request.urlopen(request) as answer:
    print(json.load(answer)["bytes"])
"""


class _Lateness:
    """How late a task that sleeps ``every`` seconds woke at worst since
    :meth:`reset`."""

    def __init__(self) -> None:
        self.worst = 0.0

    def reset(self) -> None:
        self.worst = 0.0

    async def tick(self, every: float) -> None:
        while True:
            began = time.perf_counter()
            await trio.sleep(every)
            self.worst = max(self.worst, time.perf_counter() - began - every)


def _config(root: Path) -> Path:
    path = root / "yard.toml"
    path.write_text(
        f'[server]\nlisten = "127.0.0.1:0"\ndata_dir = "{root / "data"}"\nstop_grace_s = 2\n\n'
        f"[backends.llm]\ncommand = {json.dumps(backend_command())}\nmodels = "
        '["tiny"]\nslots = 1\nstartup_timeout_s = 30\n\n'
        f'[apps.bench]\nkey = "{KEY}"\n\n'
        "[jobs]\nbatch_max_file_bytes = 60000000\n"
    )
    return path


async def _run(content: bytes) -> dict[str, float]:
    expected = f"{len(content)} {hashlib.sha256(content).hexdigest()}"
    late = _Lateness()
    with tempfile.TemporaryDirectory(prefix="yard-file-content-") as tmp:
        config = load_config(_config(Path(tmp)))
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(functools.partial(serve, config, freeze_heap=True))
            batches = runtime.parts.batches
            assert isinstance(batches, Batches)
            nursery.start_soon(late.tick, 0.001)
            await trio.sleep(1.0)  # settle

            late.reset()
            await trio.sleep(1.0)
            baseline = late.worst

            late.reset()
            began = time.perf_counter()
            await batches.store.add_file(
                file_id="file-bench",
                app="bench",
                purpose="batch_output",
                filename="out.jsonl",
                content=content,
                created_at=time.time(),
            )
            store_s = time.perf_counter() - began
            stored = late.worst
            await trio.sleep(0.2)

            late.reset()
            began = time.perf_counter()
            row = await batches.store.jobs.database.fetchone(
                "SELECT body FROM file_contents WHERE file_id = ?", ("file-bench",)
            )
            read_s = time.perf_counter() - began
            assert row is not None and len(row[0]) == len(content)
            del row
            one_read = late.worst
            await trio.sleep(0.2)

            late.reset()
            url = f"{runtime.urls[0]}/v1/files/file-bench/content"
            began = time.perf_counter()
            client = await trio.run_process(
                [sys.executable, "-c", _CLIENT, url, KEY], capture_stdout=True
            )
            download_s = time.perf_counter() - began
            download = late.worst
            got = client.stdout.decode().strip()
            assert got == expected, f"the download differs: {got} != {expected}"

            await trio.sleep(0.2)
            late.reset()
            began = time.perf_counter()
            uploaded = await trio.run_process(
                [sys.executable, "-c", _UPLOAD, f"{runtime.urls[0]}/v1/files", KEY],
                stdin=content,
                capture_stdout=True,
            )
            upload_s = time.perf_counter() - began
            upload = late.worst
            assert uploaded.stdout.decode().strip() == str(len(content)), uploaded.stdout
            nursery.cancel_scope.cancel()
    return {
        "upload_ms": upload * 1000,
        "upload_s": upload_s,
        "baseline_ms": baseline * 1000,
        "store_ms": stored * 1000,
        "store_s": store_s,
        "one_read_ms": one_read * 1000,
        "one_read_s": read_s,
        "download_ms": download * 1000,
        "download_s": download_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.file_content", description=__doc__)
    parser.add_argument("--mb", type=float, default=55.0, help="the file's size, MB")
    parser.add_argument("--runs", type=int, default=3, help="runs; figures are their medians")
    args = parser.parse_args(argv)
    # Output-like lines: JSON text, compressible, as a batch's output is.
    line = b'{"id": "batch_req_0", "custom_id": "c", "response": {"body": "%s"}}\n'
    one = line % (b"x" * 900)
    content = one * int(args.mb * 1e6 / len(one))
    load_before = os.getloadavg()[0]
    runs = [trio.run(_run, content) for _ in range(args.runs)]
    load_after = os.getloadavg()[0]
    print(
        f"a {len(content) / 1e6:.1f} MB file; {args.runs} run(s), median [range]; "
        f"load average {load_before:.1f} -> {load_after:.1f}"
    )
    print(
        "  latest a 1 ms timer woke, ms: idle baseline "
        f"{figure(runs, 'baseline_ms')}; while the file is read as one value "
        f"{figure(runs, 'one_read_ms')} (in {figure(runs, 'one_read_s', '.2f')} s); while it "
        f"is downloaded {figure(runs, 'download_ms')} (in {figure(runs, 'download_s', '.2f')} s)"
    )
    print(
        f"  while it is stored (durably, as a batch's output file is): {figure(runs, 'store_ms')}"
        f" (in {figure(runs, 'store_s', '.2f')} s); while it is uploaded (POST /v1/files) "
        f"{figure(runs, 'upload_ms')} (in {figure(runs, 'upload_s', '.2f')} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

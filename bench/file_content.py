"""A large stored file downloaded while yard serves: ``python -m bench.file_content``.

A Batch API file (``GET /v1/files/ID/content``) of ``--mb`` MB (55 by default,
the size of a big batch's output; JSONL batch request lines, as compressible
as real ones) is read from yard's SQLite database and sent to a client, all
while yard's Trio loop serves everyone else. The figure is how late a task
that sleeps 1 ms over and over woke at worst: what any other request
(``/healthz`` included) waited meanwhile, whatever held the loop (a step, the
GIL held by a worker thread, the OS).

It runs yard in this process as ``yard serve`` does, stores the file, and in
each run measures, one after the other:

1. baseline: the worst lateness over one second with yard idle (this
   machine's own noise, measured in the same run);
2. one read: the file read back as one value, ``SELECT body`` (what yard did
   before it read files a piece at a time), for reference;
3. download: the file downloaded by a client in another process (``urllib``),
   checked by its SHA-256, with the seconds to its first byte and to its
   end; then downloaded again under ``tracemalloc``: the most of the file
   the server held at once, beside what reading the whole file before the
   first byte held (what yard did before downloads streamed), and the
   server's first read (the download's first pieces) beside the whole read.

``--postgres`` does the same on a PostgreSQL of its own (a node of a
cluster), and beside it, the file stored and read back a MiB at a time by
the batch store on the schema before files were stored uncompressed
(version 5: compressed, each piece decompressed from the file's start) and on
today's: seconds to write and to read, the file's size on disk, and the 1 ms
timer's lateness during the read.

With ``--runs N`` it prints the median of N runs and their range, with the
machine's load average.
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from bench.batch_big import figure
from yard.app.serve import serve
from yard.batches.service import Batches
from yard.batches.store import BatchStore
from yard.cluster.batches import ClusterBatchStore
from yard.cluster.jobs import ClusterJobStore
from yard.cluster.pg import PgDatabase
from yard.cluster.schema import MIGRATIONS
from yard.config import load_config
from yard.testing.backend import backend_command
from yard.testing.payloads import batch_jsonl
from yard.testing.postgres import PostgresServer, start_postgres

KEY = "sk-bench"
_CLIENT = """
import hashlib, sys, time, urllib.request
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
digest, size = hashlib.sha256(), 0
began = time.perf_counter()
with urllib.request.urlopen(request) as answer:
    piece = answer.read1(1 << 20)
    first = time.perf_counter() - began
    while piece:
        digest.update(piece)
        size += len(piece)
        piece = answer.read(1 << 20)
print(size, digest.hexdigest(), first, time.perf_counter() - began)
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


def _config(root: Path, size: int, dsn: str | None) -> Path:
    path = root / "yard.toml"
    path.write_text(
        f'[server]\nlisten = "127.0.0.1:0"\ndata_dir = "{root / "data"}"\nstop_grace_s = 2\n'
        f"max_body_bytes = {size + 1_000_000}\n\n"
        f"[backends.llm]\ncommand = {json.dumps(backend_command())}\nmodels = "
        '["tiny"]\nslots = 1\nstartup_timeout_s = 30\n\n'
        f'[apps.bench]\nkey = "{KEY}"\n\n'
        f"[jobs]\nbatch_max_file_bytes = {size + 1_000_000}\n"
        + ("" if dsn is None else f'\n[cluster]\ndatabase = "{dsn}"\nnode = "bench"\n')
    )
    return path


async def _store(store: BatchStore, content: bytes) -> float:
    """Store the file as a batch's output is stored (durably); the seconds it took."""
    began = time.perf_counter()
    await store.add_file(
        file_id="file-bench",
        app="bench",
        purpose="batch_output",
        filename="out.jsonl",
        content=content,
        created_at=time.time(),
    )
    return time.perf_counter() - began


async def _download(url: str) -> tuple[str, float, float]:
    """The file downloaded by a client in another process: its size and
    SHA-256, seconds to its first byte and to its end (from the request)."""
    client = await trio.run_process([sys.executable, "-c", _CLIENT, url, KEY], capture_stdout=True)
    size, digest, first_s, whole_s = client.stdout.decode().split()
    return f"{size} {digest}", float(first_s), float(whole_s)


@dataclass(slots=True)
class _Held:
    """The most memory of Python's allocations (``tracemalloc``: the file's
    pieces are bytes objects) held at once, MB."""

    mb: float = 0.0


@contextmanager
def _peak() -> Iterator[_Held]:
    held = _Held()
    gc.collect()
    tracemalloc.start()
    try:
        yield held
        held.mb = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


async def _run(content: bytes, dsn: str | None = None) -> dict[str, float]:
    """One run of yard serve on SQLite, or on PostgreSQL at ``dsn``."""
    expected = f"{len(content)} {hashlib.sha256(content).hexdigest()}"
    late = _Lateness()
    with tempfile.TemporaryDirectory(prefix="yard-file-content-") as tmp:
        config = load_config(_config(Path(tmp), len(content), dsn))
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
            store_s = await _store(batches.store, content)
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
            got, first_s, whole_s = await _download(url)
            download_s = time.perf_counter() - began
            download = late.worst
            assert got == expected, f"the download differs: {got} != {expected}"

            # Memory, apart (tracing slows every allocation): what the
            # server holds at most during a download, and beside it what
            # reading the whole file before the first byte held (yard
            # before downloads streamed: read_blob of the whole file).
            await trio.sleep(0.2)
            with _peak() as held:
                got, _, _ = await _download(url)
            assert got == expected, f"the download differs: {got} != {expected}"
            began = time.perf_counter()
            stream = await batches.store.content_stream("file-bench")
            first_read_s = time.perf_counter() - began
            assert stream is not None and stream.length == len(content)
            del stream
            with _peak() as whole:
                began = time.perf_counter()
                blob = await batches.store.jobs.database.read_blob(
                    "file_contents", "body", "file_id", "file-bench"
                )
                whole_read_s = time.perf_counter() - began
                assert blob is not None and blob.length == len(content)
                del blob

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
        "first_byte_s": first_s,
        "client_s": whole_s,
        "held_mb": held.mb,
        "whole_mb": whole.mb,
        "whole_read_s": whole_read_s,
        "first_read_s": first_read_s,
    }


async def _stored_and_read(dsn: str, content: bytes, *, schema: int) -> dict[str, float]:
    """The file stored and read back a MiB at a time by the batch store, on a
    database migrated up to ``schema``: seconds, bytes on disk, the loop's
    worst lateness during the read."""
    db = await PgDatabase.open(dsn, [m for m in MIGRATIONS if m.version <= schema])
    late = _Lateness()
    try:
        store = ClusterBatchStore(ClusterJobStore(db, node="bench", aging_rate=0.1))
        write_s = await _store(store, content)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(late.tick, 0.001)
            await trio.sleep(0.2)
            late.reset()
            began = time.perf_counter()
            read = await store.content("file-bench")
            read_s = time.perf_counter() - began
            nursery.cancel_scope.cancel()
        assert read is not None and hashlib.sha256(read).digest() == (
            hashlib.sha256(content).digest()
        ), "the file read back differs"
        del read
        row = await db.fetchone("SELECT pg_total_relation_size('file_contents')")
        assert row is not None
        return {
            "write_s": write_s,
            "read_s": read_s,
            "read_ms": late.worst * 1000,
            "disk_mb": int(row[0]) / 1e6,
        }
    finally:
        await db.close()


_BEFORE = 5
"""The schema version before files were stored uncompressed."""


def _postgres_run(server: PostgresServer, content: bytes) -> dict[str, float]:
    """Before and after, each on a fresh database, then a node's download."""
    figures: dict[str, float] = {}
    for side, schema in (("before", _BEFORE), ("now", MIGRATIONS[-1].version)):
        name = server.create_database()
        try:
            stored = trio.run(
                functools.partial(_stored_and_read, schema=schema), server.dsn(name), content
            )
        finally:
            server.drop_database(name)
        figures |= {f"{side}_{key}": value for key, value in stored.items()}
    name = server.create_database()
    try:
        figures |= trio.run(_run, content, server.dsn(name))
    finally:
        server.drop_database(name)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.file_content", description=__doc__)
    parser.add_argument("--mb", type=float, default=55.0, help="the file's size, MB")
    parser.add_argument("--runs", type=int, default=3, help="runs; figures are their medians")
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="also on PostgreSQL: before and after files were stored uncompressed, and a node",
    )
    args = parser.parse_args(argv)
    content = batch_jsonl(int(args.mb * 1e6))
    load_before = os.getloadavg()[0]
    runs = [trio.run(_run, content) for _ in range(args.runs)]
    pg_runs: list[dict[str, float]] = []
    if args.postgres:
        with start_postgres() as server:
            pg_runs = [_postgres_run(server, content) for _ in range(args.runs)]
    load_after = os.getloadavg()[0]
    print(
        f"a {len(content) / 1e6:.1f} MB file of JSONL batch request lines; {args.runs} run(s), "
        f"median [range]; load average {load_before:.1f} -> {load_after:.1f}"
    )
    _print_serve("SQLite", runs)
    if pg_runs:
        _print_serve("PostgreSQL (a node of a cluster)", pg_runs)
        before = statistics.median(run["before_read_s"] for run in pg_runs)
        now = statistics.median(run["now_read_s"] for run in pg_runs)
        print(
            "  PostgreSQL, stored and read back a MiB at a time by the batch store, as files were "
            f"stored before (schema {_BEFORE}, compressed) -> now (uncompressed):"
        )
        print(
            f"    read {figure(pg_runs, 'before_read_s', '.2f')} s -> "
            f"{figure(pg_runs, 'now_read_s', '.2f')} s ({before / now:.0f}x faster); "
            f"written {figure(pg_runs, 'before_write_s', '.2f')} s -> "
            f"{figure(pg_runs, 'now_write_s', '.2f')} s; on disk "
            f"{figure(pg_runs, 'before_disk_mb')} MB -> {figure(pg_runs, 'now_disk_mb')} MB"
        )
        print(
            "    latest a 1 ms timer woke during the read, ms: "
            f"{figure(pg_runs, 'before_read_ms')} -> {figure(pg_runs, 'now_read_ms')}"
        )
    return 0


def _print_serve(database: str, runs: list[dict[str, float]]) -> None:
    print(
        f"  {database}: latest a 1 ms timer woke, ms: idle baseline "
        f"{figure(runs, 'baseline_ms')}; while the file is read as one value "
        f"{figure(runs, 'one_read_ms')} (in {figure(runs, 'one_read_s', '.2f')} s); while it "
        f"is downloaded {figure(runs, 'download_ms')} (in {figure(runs, 'download_s', '.2f')} s)"
    )
    print(
        f"    while it is stored (durably, as a batch's output file is): {figure(runs, 'store_ms')}"
        f" (in {figure(runs, 'store_s', '.2f')} s); while it is uploaded (POST /v1/files) "
        f"{figure(runs, 'upload_ms')} (in {figure(runs, 'upload_s', '.2f')} s)"
    )
    print(
        f"    a download: the server held {figure(runs, 'held_mb')} MB of it at most, where "
        f"reading the whole file before the first byte (yard before) held "
        f"{figure(runs, 'whole_mb')} MB ({_ratio(runs, 'whole_mb', 'held_mb')}x less)"
    )
    print(
        f"      the server can answer after its first read, {figure(runs, 'first_read_s', '.3f')}"
        f" s, where the whole read took {figure(runs, 'whole_read_s', '.3f')} s "
        f"({_ratio(runs, 'whole_read_s', 'first_read_s')}x sooner); the client's first byte "
        f"came after {figure(runs, 'first_byte_s', '.3f')} s, the whole file after "
        f"{figure(runs, 'client_s', '.2f')} s"
    )


def _ratio(runs: list[dict[str, float]], before: str, now: str) -> str:
    """The median over ``runs`` of ``before / now``."""
    return f"{statistics.median(run[before] / max(run[now], 1e-9) for run in runs):.1f}"


if __name__ == "__main__":
    sys.exit(main())

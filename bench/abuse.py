"""The abuse benchmark: ``python -m bench.abuse`` (part of ``make bench``).

Issue 10's target: during any single abusive client, ``/healthz`` and a
proxied request from another client answer within 100 ms p99. This runs the
real ``yard serve`` on loopback (its open-file limit set to 1,024, a common
default) with two backends of this module's own minimal upstream (``bench``:
64 slots, small answers; ``big``: 8 slots, 8 MiB answers), and for each
attack, one at a time:

- an attacker process starts the attack and says when it is in place;
- this process probes for ``--seconds``: a fresh connection every 25 ms,
  alternately ``GET /healthz`` and a small ``POST /v1/chat/completions`` to
  the ``bench`` model (another app's key). A probe's latency counts from the
  moment it was due, so a stalled yard is not hidden by probes that could not
  be sent (no coordinated omission); a probe over 2 s counts as 2 s, failed,
  and a probe still due when the window ends counts its wait until then;
- the attacker is stopped and yard's recovery is timed (first ``/healthz``).

A baseline window without any attack runs first, and another one last (the
machine's own noise), in the same run. Attacks:

- ``login-60MiB``: ``POST /dashboard/login`` with a 60 MiB url-encoded form
  (``a=b&a=b&...``), no key, again and again;
- ``form-60MiB``: the same form to ``/v1/chat/completions`` with an app key
  (yard looks for the ``model`` field in it);
- ``json-60MiB``: a 60 MiB JSON body to ``/v1/chat/completions`` (an array of
  30 million numbers, the ``model`` at the end);
- ``slow-1000``: 1,000 connections that send a request head slowly (half of
  them the whole head of a login with ``Content-Length: 100`` and no body,
  which yard's login waits for), a byte per connection every second,
  reconnecting when yard closes one (up to 200 a second);
- ``nonreading-8``: 8 clients ask the ``big`` model for 8 MiB answers and
  never read them.

Each window also shows the CPU time yard used in it, as a share of one core.

Everything is bounded (a window per attack, 90 s at most for a recovery) and
stays on loopback; the temporary directory and every process are removed at
the end. ``--strict`` exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
ATTACKS = ("login-60MiB", "form-60MiB", "json-60MiB", "slow-1000", "nonreading-8")
TARGET_MS = 100.0
PROBE_EVERY_S = 0.025
PROBE_TIMEOUT_S = 2.0
RECOVERY_S = 90.0
YARD_NOFILE = 1024
ADMIN_KEY = "abuse-admin-key"
PROBER_KEY = "abuse-prober-key"
ATTACKER_KEY = "abuse-attacker-key"
SMALL = b'{"model":"bench","messages":[{"role":"user","content":"hi"}]}'
BIG_ANSWER = 8 * 2**20
BODY_SIZE = 60 * 2**20


# -- the upstream (a backend process yard starts) --------------------------------


def upstream(port: int, big: bool) -> None:
    """Serve ``/health`` (200) and answer every other request: 8 MiB with
    ``big``, else a small JSON document. Runs until killed."""
    import h11
    import trio

    small = b'{"object":"chat.completion","choices":[{"message":{"content":"ok"}}]}'
    piece = b"x" * 2**20

    async def handle(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        target = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                    continue
                if isinstance(event, h11.Request):
                    target = event.target
                elif isinstance(event, h11.EndOfMessage):
                    size = BIG_ANSWER if big and target != b"/health" else len(small)
                    head = [
                        (b"content-type", b"application/json"),
                        (b"content-length", b"%d" % size),
                    ]
                    response = h11.Response(status_code=200, headers=head)
                    await stream.send_all(conn.send(response) or b"")
                    if size == len(small):
                        await stream.send_all(conn.send(h11.Data(data=small)) or b"")
                    else:
                        for _ in range(size // len(piece)):
                            await stream.send_all(conn.send(h11.Data(data=piece)) or b"")
                    await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
                elif not isinstance(event, h11.Data):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        print(f"listening on http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", flush=True)
        await trio.serve_listeners(handle, listeners)

    trio.run(main)


# -- the attacker (its own process) ------------------------------------------------


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _post_forever(port: int, path: str, headers: dict[str, str], body: bytes) -> None:
    print("ready", flush=True)
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            conn.request("POST", path, body=body, headers=headers)
            conn.getresponse().read()
        except OSError:
            time.sleep(0.05)
        finally:
            conn.close()


def _slow_connections(port: int, count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 256)), hard))
    # Host: a name yard accepts on loopback, so that the login's body is
    # waited for (with another name, yard's guard answers 403 at once).
    heads = [
        b"POST /dashboard/login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n",
    ]

    def open_one(i: int) -> socket.socket | None:
        try:
            sock = _connect(port)
            sock.sendall(heads[i % 2])
            sock.setblocking(False)
            return sock
        except OSError:
            return None

    socks = [open_one(i) for i in range(count)]
    print("ready", flush=True)
    while True:
        time.sleep(1.0)
        reconnects = 0
        for i, sock in enumerate(socks):
            if sock is not None:
                try:
                    # A slowloris head grows by one header byte; the other
                    # half sent its whole head and never sends the body.
                    if i % 2:
                        sock.send(b"X")
                    else:
                        sock.recv(65536, socket.MSG_PEEK)
                        raise ConnectionResetError  # yard answered or closed: go again
                    continue
                except BlockingIOError:
                    continue
                except OSError:
                    sock.close()
                    socks[i] = None
            if reconnects < 200:
                reconnects += 1
                socks[i] = open_one(i)
        print(reconnects, flush=True)  # (the benchmark sums them)


def _non_readers(port: int, count: int) -> None:
    socks = []
    body = b'{"model":"big","messages":[{"role":"user","content":"hi"}]}'
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: yard\r\n"
            b"Authorization: Bearer " + ATTACKER_KEY.encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        socks.append(sock)
    print("ready", flush=True)
    while True:
        time.sleep(60)


def attack(name: str, port: int, count: int | None = None) -> None:
    """Run the attack ``name`` against yard on ``port`` until killed
    (``count``: connections of ``slow-1000``, clients of ``nonreading-8``)."""
    form = b"a=b&" * (BODY_SIZE // 4)
    app_headers = {"Authorization": f"Bearer {ATTACKER_KEY}"}
    if name == "login-60MiB":
        form_type = {"Content-Type": "application/x-www-form-urlencoded"}
        _post_forever(port, "/dashboard/login", form_type, form)
    elif name == "form-60MiB":
        headers = {**app_headers, "Content-Type": "application/x-www-form-urlencoded"}
        _post_forever(port, "/v1/chat/completions", headers, form)
    elif name == "json-60MiB":
        count = (BODY_SIZE - 32) // 2
        body = b'{"pad":[' + b"0," * count + b'0],"model":"nope"}'
        del form
        headers = {**app_headers, "Content-Type": "application/json"}
        _post_forever(port, "/v1/chat/completions", headers, body)
    elif name == "slow-1000":
        _slow_connections(port, count or 1000)
    elif name == "nonreading-8":
        _non_readers(port, count or 8)
    else:
        raise SystemExit(f"unknown attack {name!r}; one of {', '.join(ATTACKS)}")


# -- probes and the report ------------------------------------------------------------


@dataclass(slots=True)
class Probes:
    """Latencies (ms, from when each probe was due) and failures of one window;
    ``sent``: probes that went out (the others were due during a stall)."""

    healthz: list[float] = field(default_factory=list)
    proxied: list[float] = field(default_factory=list)
    healthz_failed: int = 0
    proxied_failed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    sent: int = 0


def _one(port: int, kind: str, due: float) -> tuple[float, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT_S)
    try:
        if kind == "healthz":
            conn.request("GET", "/healthz")
        else:
            headers = {"Authorization": f"Bearer {PROBER_KEY}", "Content-Type": "application/json"}
            conn.request("POST", "/v1/chat/completions", body=SMALL, headers=headers)
        response = conn.getresponse()
        response.read()
        outcome = str(response.status)
    except (OSError, http.client.HTTPException) as exc:
        outcome = type(exc).__name__
    finally:
        conn.close()
    return min((time.monotonic() - due) * 1000.0, PROBE_TIMEOUT_S * 1000.0), outcome


def probe(port: int, seconds: float) -> Probes:
    """Probe yard for ``seconds``: healthz and a proxied request, alternately."""
    result = Probes()
    start = time.monotonic()
    due = start
    kinds = ("healthz", "proxied")
    n = 0
    # Probes stay on their schedule: after a stall, the ones that were due
    # during it go out at once and count their wait.
    while time.monotonic() < start + seconds:
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        kind = kinds[n % 2]
        ms, outcome = _one(port, kind, due)
        result.sent += 1
        ok = outcome == "200"
        getattr(result, kind).append(ms)
        if not ok:
            setattr(result, f"{kind}_failed", getattr(result, f"{kind}_failed") + 1)
            key = f"{kind}:{outcome}"
            result.statuses[key] = result.statuses.get(key, 0) + 1
        n += 1
        due += PROBE_EVERY_S
    # Probes that were due in the window but could not go out (yard stalled
    # the one before) waited at least until the window's end.
    end = time.monotonic()
    while due < start + seconds:
        kind = kinds[n % 2]
        getattr(result, kind).append(min((end - due) * 1000.0, PROBE_TIMEOUT_S * 1000.0))
        n += 1
        due += PROBE_EVERY_S
    return result


def _cpu_s(pid: int) -> float:
    """CPU time (user and system) the process ``pid`` has used so far, in s."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _wait_healthy(port: int, seconds: float) -> float | None:
    """Seconds until ``/healthz`` answered 200, or None within ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        _, outcome = _one(port, "healthz", time.monotonic())
        if outcome == "200":
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (YARD_NOFILE, YARD_NOFILE))


@contextlib.contextmanager
def running_yard(work: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A real ``yard serve`` on a free loopback port, stopped (SIGTERM, then
    SIGKILL after 30 s) on the way out."""
    port = _free_port()

    def command(*extra: str) -> str:
        return json.dumps([PY, "-m", "bench.abuse", "_upstream", "--port", "{port}", *extra])

    apps = "".join(
        f'[apps.{name}]\nkey = "{key}"\ndefault_priority = 50\nmax_priority = 100\n\n'
        for name, key in (("prober", PROBER_KEY), ("attacker", ATTACKER_KEY))
    )
    (work / "yard.toml").write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "{work / "data"}"\n'
        f'admin_key = "{ADMIN_KEY}"\nlog_level = "warning"\nstop_grace_s = 5\n\n{apps}'
        f'[backends.bench]\nmodels = ["bench"]\ncommand = {command()}\ncwd = "{ROOT}"\n'
        f"slots = 64\n\n"
        f'[backends.big]\nmodels = ["big"]\ncommand = {command("--big")}\ncwd = "{ROOT}"\n'
        f"slots = 8\n"
    )
    with (work / "yard.log").open("wb") as log:
        proc = subprocess.Popen(
            [PY, "-m", "yard.cli", "serve", "--config", str(work / "yard.toml")],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=_limit_files,
        )
    try:
        if _wait_healthy(port, 60) is None:
            raise RuntimeError(f"yard did not start; see {work / 'yard.log'}")
        yield port, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _warm(port: int) -> None:
    for model in ("bench", "big"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            body = json.dumps({"model": model, "messages": []}).encode()
            headers = {"Authorization": f"Bearer {PROBER_KEY}", "Content-Type": "application/json"}
            conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"warming {model}: yard answered {response.status}")
        finally:
            conn.close()


@dataclass(slots=True)
class Row:
    name: str
    probes: Probes
    recovery_s: float | None
    cpu: float
    """yard's CPU time over the probing window, as a share of one core."""
    reconnects: int = 0
    """New connections the attacker opened after its first ones (slow-1000)."""


def probe_window(port: int, pid: int, seconds: float) -> tuple[Probes, float]:
    """:func:`probe`, and the CPU share of yard (process ``pid``) meanwhile."""
    cpu, start = _cpu_s(pid), time.monotonic()
    probes = probe(port, seconds)
    return probes, (_cpu_s(pid) - cpu) / (time.monotonic() - start)


def run_attack(name: str, port: int, pid: int, seconds: float) -> Row:
    """Probe yard while ``name`` runs against it; then stop it and time the recovery."""
    proc = subprocess.Popen(
        [PY, "-m", "bench.abuse", "_attack", name, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"attack {name} did not start: {line!r}")
        probes, cpu = probe_window(port, pid, seconds)
    finally:
        proc.kill()
        proc.wait()
        reconnects = 0
        if proc.stdout is not None:
            reconnects = sum(int(line) for line in proc.stdout.read().split() if line.isdigit())
            proc.stdout.close()
    return Row(name, probes, _wait_healthy(port, RECOVERY_S), cpu, reconnects)


def report(rows: list[Row], seconds: float) -> bool:
    """Print the table; True when every attack met the target."""
    print(
        f"yard abuse benchmark: {seconds:g} s per window, a probe every "
        f"{PROBE_EVERY_S * 1000:.0f} ms (healthz and proxied alternately, fresh connections, "
        f"latency from when due, {PROBE_TIMEOUT_S:g} s cap); {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'window':14}{'healthz p50':>12}{'p99':>9}{'max':>9}{'fail':>6}"
        f"{'proxied p50':>13}{'p99':>9}{'max':>9}{'fail':>6}{'sent':>6}{'recovery':>10}"
        f"{'yard CPU':>9}  target"
    )
    met = True
    for row in rows:
        p = row.probes
        ok = (
            _pct(p.healthz, 0.99) <= TARGET_MS
            and _pct(p.proxied, 0.99) <= TARGET_MS
            and not p.healthz_failed
            and not p.proxied_failed
        )
        if not row.name.startswith("baseline"):
            met = met and ok
        recovery = "-" if row.recovery_s is None else f"{row.recovery_s:.1f} s"
        if row.recovery_s is None and not row.name.startswith("baseline"):
            recovery = f">{RECOVERY_S:g} s"
        print(
            f"{row.name:14}{_pct(p.healthz, 0.5):>10.1f}ms{_pct(p.healthz, 0.99):>7.1f}ms"
            f"{max(p.healthz, default=float('nan')):>7.0f}ms{p.healthz_failed:>6}"
            f"{_pct(p.proxied, 0.5):>11.1f}ms{_pct(p.proxied, 0.99):>7.1f}ms"
            f"{max(p.proxied, default=float('nan')):>7.0f}ms{p.proxied_failed:>6}"
            f"{p.sent:>6}{recovery:>10}{row.cpu * 100:>8.0f}%  {'PASS' if ok else 'MISS'}"
        )
        if p.statuses:
            print(f"{'':14}failed probes: {p.statuses}")
        if row.reconnects:
            print(f"{'':14}the attacker reconnected {row.reconnects} times")
    print(
        f"  {'PASS' if met else 'MISS'}  /healthz and a proxied request within {TARGET_MS:g} ms "
        "p99 during each attack"
    )
    return met


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["_upstream"]:
        p = argparse.ArgumentParser(prog="python -m bench.abuse _upstream")
        p.add_argument("--port", type=int, default=0)
        p.add_argument("--big", action="store_true")
        ns = p.parse_args(args_in[1:])
        with contextlib.suppress(KeyboardInterrupt):
            upstream(ns.port, ns.big)
        return 0
    if args_in[:1] == ["_attack"]:
        p = argparse.ArgumentParser(prog="python -m bench.abuse _attack")
        p.add_argument("name", choices=ATTACKS)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--count", type=int, default=None)
        ns = p.parse_args(args_in[1:])
        attack(ns.name, ns.port, ns.count)
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.abuse", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="probing time per window")
    parser.add_argument(
        "--attack", action="append", choices=ATTACKS, help="run only these (repeatable)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(args_in)
    # SIGTERM stops the run like Ctrl-C: yard and its backends are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    work = Path(tempfile.mkdtemp(prefix="yard-abuse-"))
    rows: list[Row] = []
    try:
        with running_yard(work) as (port, yard):
            _warm(port)
            time.sleep(3.0)  # past the first loads' measuring
            # A first window of probes, not counted: in every run so far one
            # stall of about 250 ms came within the first seconds of probing,
            # attack or not (the second baseline, at the end, never had it).
            probe(port, 2.0)
            probes, cpu = probe_window(port, yard.pid, args.seconds)
            rows.append(Row("baseline", probes, None, cpu))
            for name in args.attack or ATTACKS:
                rows.append(run_attack(name, port, yard.pid, args.seconds))
                time.sleep(1.0)  # let yard settle (closing connections, freeing memory)
            # A second baseline shows how much of a window's tail is the machine.
            probes, cpu = probe_window(port, yard.pid, args.seconds)
            rows.append(Row("baseline-end", probes, None, cpu))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    met = report(rows, args.seconds)
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())

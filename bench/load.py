"""The load generator of the proxy benchmark, run as its own process so that
it does not share a CPU with what it measures.

``python -m bench.load latency URL --requests N``: one connection, requests
one after another; prints the latencies (µs) as JSON.
``python -m bench.load throughput URL --connections C --seconds S``: C
keep-alive connections (Trio, raw sockets), prints completed requests and
the elapsed time as JSON.
``python -m bench.load stream URL --runs N``: streamed requests; prints the
time to the first byte of the response and to its first event (µs), and each
event's lag behind its send time.

Every mode sends the same small chat-completion POST. Responses are parsed
just enough to find their end (Content-Length, or chunked framing).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from urllib.parse import urlsplit

import trio

BODY = b'{"model":"bench","messages":[{"role":"user","content":"hi"}]}'


def request_bytes(url: str) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = (
        f"POST {target} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(BODY)}\r\n\r\n"
    ).encode()
    return host, port, head + BODY


class _Reader:
    """Reads whole HTTP/1.1 responses from a byte source."""

    def __init__(self) -> None:
        self.buffer = b""

    def response_end(self) -> int | None:
        """Index just past the first complete response in the buffer, or None."""
        buf = self.buffer
        head_end = buf.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        head = buf[:head_end].lower()
        start = head_end + 4
        at = head.find(b"content-length:")
        if at >= 0:
            line_end = head.find(b"\r\n", at)
            length = int(head[at + 15 : line_end if line_end >= 0 else None])
            return start + length if len(buf) >= start + length else None
        end = buf.find(b"\r\n0\r\n\r\n", start - 2)
        return end + 7 if end >= 0 else None


def latency(url: str, requests: int, warmup: int) -> list[float]:
    host, port, payload = request_bytes(url)
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = _Reader()
    out: list[float] = []
    for i in range(warmup + requests):
        t0 = time.perf_counter_ns()
        sock.sendall(payload)
        while True:
            end = reader.response_end()
            if end is not None:
                reader.buffer = reader.buffer[end:]
                break
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            reader.buffer += data
        if i >= warmup:
            out.append((time.perf_counter_ns() - t0) / 1000.0)
    sock.close()
    return out


async def _worker(host: str, port: int, payload: bytes, stop_at: float, counts: list[int]) -> None:
    stream = await trio.open_tcp_stream(host, port)
    reader = _Reader()
    done = 0
    async with stream:
        while trio.current_time() < stop_at:
            await stream.send_all(payload)
            while True:
                end = reader.response_end()
                if end is not None:
                    reader.buffer = reader.buffer[end:]
                    break
                data = await stream.receive_some(65536)
                if not data:
                    raise ConnectionError("server closed the connection")
                reader.buffer += data
            done += 1
    counts.append(done)


async def _throughput(url: str, connections: int, seconds: float) -> dict[str, float]:
    host, port, payload = request_bytes(url)
    counts: list[int] = []
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(_worker, host, port, payload, start + seconds, counts)
    return {"requests": sum(counts), "seconds": trio.current_time() - start}


def stream(url: str, runs: int) -> dict[str, list[float]]:
    host, port, payload = request_bytes(url)
    ttfb: list[float] = []
    first_event: list[float] = []
    lags: list[float] = []
    gaps: list[float] = []
    for _ in range(runs):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter_ns()
        sock.sendall(payload)
        buf = b""
        first = None
        previous = None
        while True:
            data = sock.recv(65536)
            now_wall = time.time()
            now = time.perf_counter_ns()
            if not data:
                break
            if not buf:
                ttfb.append((now - t0) / 1000.0)
            buf += data
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                continue
            body = buf[head_end + 4 :]
            # Each event carries the upstream's send time: the lag is how long
            # it took to get here (on one machine, one clock).
            for piece in data.split(b'"sent":')[1:]:
                sent = float(piece.split(b"}")[0])
                lags.append((now_wall - sent) * 1e6)
                if first is None:
                    first = (now - t0) / 1000.0
                if previous is not None:
                    gaps.append((now - previous) / 1000.0)
                previous = now
            if body.endswith(b"0\r\n\r\n"):
                break
        sock.close()
        if first is not None:
            first_event.append(first)
    return {"ttfb_us": ttfb, "first_event_us": first_event, "lag_us": lags, "gap_us": gaps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load")
    parser.add_argument("mode", choices=("latency", "throughput", "stream"))
    parser.add_argument("url")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    if args.mode == "latency":
        result: object = latency(args.url, args.requests, args.warmup)
    elif args.mode == "throughput":
        result = trio.run(_throughput, args.url, args.connections, args.seconds)
    else:
        result = stream(args.url, args.runs)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

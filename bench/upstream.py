"""A minimal, fast upstream for the proxy benchmark: trio + h11.

``python -m bench.upstream --port 0`` prints ``listening on http://HOST:PORT``
once bound. Any request gets a small JSON answer, except:

- ``GET /health``: 200.
- a path with ``stream`` in it (``/v1/stream?n=N&ms=M``): N server-sent events, M
  milliseconds apart, each carrying the upstream's send time (``time.time()``)
  so the client can tell whether chunks were held back on the way.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from urllib.parse import parse_qs

import h11
import trio

_SMALL = (
    b'{"id":"cmpl-bench","object":"chat.completion",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'
)
_SMALL_HEAD = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_SMALL))]
_SSE_HEAD = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def _handle(stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    target = b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                target = event.target
            elif isinstance(event, h11.EndOfMessage):
                if b"stream" in target.partition(b"?")[0]:
                    await _stream(stream, conn, target)
                else:
                    await stream.send_all(
                        conn.send(h11.Response(status_code=200, headers=_SMALL_HEAD))
                        + conn.send(h11.Data(data=_SMALL))
                        + conn.send(h11.EndOfMessage())
                    )
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
            elif isinstance(event, h11.Data):
                continue
            else:
                return
    except (trio.BrokenResourceError, h11.RemoteProtocolError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def _stream(stream: trio.SocketStream, conn: h11.Connection, target: bytes) -> None:
    query = parse_qs(target.partition(b"?")[2].decode())
    count = int(query.get("n", ["10"])[0])
    interval = float(query.get("ms", ["10"])[0]) / 1000.0
    data = conn.send(h11.Response(status_code=200, headers=_SSE_HEAD))
    assert data is not None
    await stream.send_all(data)
    for i in range(count):
        if i:
            await trio.sleep(interval)
        line = b'data: {"i":%d,"sent":%.6f}\n\n' % (i, time.time())
        await stream.send_all(conn.send(h11.Data(data=line)) or b"")
    await stream.send_all(conn.send(h11.EndOfMessage()) or b"")


async def serve(host: str, port: int) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    print(f"listening on http://{host}:{bound}", flush=True)
    await trio.serve_listeners(functools.partial(_handle), listeners)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        trio.run(serve, args.host, args.port)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

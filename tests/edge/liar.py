"""A backend that lies: ``python -m tests.edge.liar --port PORT [--cookie NAME]``.

The bad-input suite runs it as a ``plain`` backend of a real yard. ``GET
/health`` and ``/ok`` answer properly; every other path is one way an HTTP
server can get its answer wrong:

- ``/te-and-cl``: both ``Transfer-Encoding: chunked`` and ``Content-Length``;
- ``/short-cl``: more body bytes than its ``Content-Length`` says;
- ``/bare-cr``: a header value with a bare CR in it;
- ``/status-99``: a status code below 100;
- ``/huge-head``: a response head of about 100 KB;
- ``/set-cookie``: a ``Set-Cookie`` named like yard's own session cookie
  (``--cookie``), beside a harmless one;
- ``/garbage``: bytes that are not HTTP;
- ``/big``: a proper 8 MiB answer (for clients that never read it);
- ``/hold``: a proper answer, after 5 s (to keep requests busy).

Every answer closes the connection after it and says so (``connection:
close``; ``/short-cl`` does not, as its stray bytes are the lie), so a lie
never waits in a pool.
"""

from __future__ import annotations

import argparse
import os
import socket
import socketserver
import sys
import time

BIG = 8 * 2**20
# Every answer closes the connection after it, and says so (RFC 9112 section
# 9.6): a connection closed without it would be pooled by yard and, if the
# close has not reached yard by the next request, that request's write would
# meet the close (a 502 no retry may hide, as yard never retries).
_CLOSE = b"connection: close\r\n"


def _answer(path: str, cookie: str) -> bytes:
    ok = b'{"ok":true}'
    pid = b"x-liar-pid: %d\r\n" % os.getpid()
    proper = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + _CLOSE + pid
    if path in ("/health", "/ok"):
        return proper + b"content-length: %d\r\n\r\n%s" % (len(ok), ok)
    if path == "/te-and-cl":
        framing = b"transfer-encoding: chunked\r\ncontent-length: 100\r\n\r\n"
        return proper + framing + b"5\r\nhello\r\n0\r\n\r\n"
    if path == "/short-cl":
        # Without "connection: close": the bytes after the declared length
        # must keep yard from pooling the connection.
        keep = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + pid
        return keep + b"content-length: 5\r\n\r\nhello, and more than that"
    if path == "/bare-cr":
        return proper + b"x-evil: a\rinjected: 1\r\ncontent-length: 2\r\n\r\nok"
    if path == "/status-99":
        return b"HTTP/1.1 099 Too Early For Anything\r\n" + _CLOSE + b"content-length: 2\r\n\r\nok"
    if path == "/huge-head":
        filler = b"".join(b"x-filler-%04d: %s\r\n" % (i, b"f" * 80) for i in range(1200))
        return proper + filler + b"content-length: 2\r\n\r\nok"
    if path == "/set-cookie":
        cookies = b"set-cookie: %s=from-the-backend; Path=/\r\nset-cookie: other=1; Path=/\r\n" % (
            cookie.encode()
        )
        return proper + cookies + b"content-length: %d\r\n\r\n%s" % (len(ok), ok)
    if path == "/garbage":
        return b"\x00\xffTHIS IS NOT HTTP\r\n\x01\x02\r\n\r\n"
    if path == "/hold":
        time.sleep(5)
        return proper + b"content-length: %d\r\n\r\n%s" % (len(ok), ok)
    if path == "/big":
        return proper + b"content-length: %d\r\n\r\n" % BIG + b"b" * BIG
    return b"HTTP/1.1 404 Not Found\r\n" + _CLOSE + b"content-length: 0\r\n\r\n"


class _Handler(socketserver.BaseRequestHandler):
    cookie = "yard_admin"

    def handle(self) -> None:
        sock: socket.socket = self.request
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        path = lines[0].split(b" ")[1].decode("latin-1").partition("?")[0]
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return
            body += chunk
        try:
            sock.sendall(_answer(path, self.cookie))
        except OSError:
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.edge.liar")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cookie", default="yard_admin")
    args = parser.parse_args(argv)
    _Handler.cookie = args.cookie
    with _Server(("127.0.0.1", args.port), _Handler) as server:
        print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

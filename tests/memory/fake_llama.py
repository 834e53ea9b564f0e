"""A stand-in for llama.cpp's server, run as a script by the probe tests.

``python fake_llama.py PORT RECORD [MODE]``: answers /health, /props
(n_ctx 64), /tokenize and /completion like llama-server, and any other POST
as a warm-up. Every request it serves is appended to RECORD before it is
answered, so a test reads exactly what reached it. MODE ``no-props``: no
/props (a server that is not llama-server). The tests copy this file under
names with and without "llama-server" in them: the name is what
``warmup.fill_context = "auto"`` goes by.
"""

from __future__ import annotations

import http.server
import json
import sys

N_CTX = 64


def main(argv: list[str]) -> None:
    port, record = int(argv[0]), argv[1]
    mode = argv[2] if len(argv) > 2 else "ok"

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def seen(self, what: str) -> None:
            with open(record, "a") as f:
                f.write(what + "\n")

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(200, {"status": "ok"})
            elif self.path == "/props" and mode != "no-props":
                self.answer(200, {"default_generation_settings": {"n_ctx": N_CTX}})
            else:
                self.answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"] or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            if self.path == "/tokenize":
                self.answer(200, {"tokens": [11, 22, 33]})
            elif self.path == "/completion":
                self.seen(f"completion of {len(body['prompt'])} tokens")
                self.answer(200, {"content": "ok"})
            else:
                self.seen(f"warm-up {self.path}")
                self.answer(200, {"choices": []})

    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])

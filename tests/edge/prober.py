"""The /healthz prober of :func:`tests.edge.harness.healthz_answers`, run as
its own process: ``python -m tests.edge.prober PORT``, one per yard.

It waits for a command byte on its standard input: ``s`` starts probing
``GET /healthz`` on a fresh connection every :data:`PROBE_EVERY_S`, one line
per probe, ``SECONDS\\tOUTCOME`` (outcome empty for a 200); the next byte
(``e``) ends that, and it prints :data:`STOPPED`. It exits when its standard
input closes.

Why a process of its own: a probe timed by a thread of the test process
also times whatever holds that process's GIL meanwhile, such as building
a 60 MiB request (~120 ms at a load average of 6 on two cores), and
blamed it on yard. One per yard, because starting an interpreter for each
watch costs a second and more on a loaded machine. Only the standard
library is imported.
"""

from __future__ import annotations

import http.client
import os
import select
import sys
import time

PROBE_EVERY_S = 0.02
CAP_S = 0.5
"""A probe gives up after this (the harness's ``HEALTHZ_CAP_S``)."""
START = b"s"
END = b"e"
STOPPED = "stopped"


def probe(port: int) -> str:
    """One ``GET /healthz``: empty for a 200, else what went wrong."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CAP_S)
    try:
        conn.request("GET", "/healthz", headers={"Host": "127.0.0.1"})
        answer = conn.getresponse()
        answer.read()
        return "" if answer.status == 200 else f"status {answer.status}"
    except (OSError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc}".replace("\t", " ").replace("\n", " ")
    finally:
        conn.close()


def main(argv: list[str]) -> int:
    port = int(argv[0])
    stdin = sys.stdin.fileno()  # read unbuffered: select() must see every byte
    while os.read(stdin, 1) == START:
        while True:
            start = time.monotonic()
            outcome = probe(port)
            print(f"{time.monotonic() - start:.6f}\t{outcome}", flush=True)
            if select.select([stdin], [], [], PROBE_EVERY_S)[0]:
                break
        command = os.read(stdin, 1)
        print(STOPPED, flush=True)
        if command != END:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

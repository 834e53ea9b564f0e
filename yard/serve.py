"""``yard serve``: run the gateway.

The nursery tree (DESIGN.md "The shape"), each part started with
``nursery.start`` and ready only once it really is:

1. the supervisor: reaps backends a killed yard left behind, then launches;
2. the meter (``yard.memory.default_meter``: host RAM, plus GPUs via NVML);
3. the profile store (``data_dir/profiles.sqlite``);
4. the engine, which owns the scheduler core;
5. the job service (``data_dir/jobs.sqlite``), when ``yard.jobs`` is there;
6. the HTTP server: data plane and control plane on one port.

SIGINT or SIGTERM starts a graceful shutdown: the HTTP server stops
accepting and gives in-flight requests ``server.stop_grace_s``; then the job
service, the engine and the supervisor stop every backend (SIGTERM to its
group, SIGKILL after its grace). A second signal cuts the grace short.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from yard.config import Config, ConfigError, load_config
from yard.core import Scheduler
from yard.engine import Engine
from yard.http.app import create_app, serve_app
from yard.http.runtime import Runtime
from yard.http.server import open_listeners
from yard.supervisor import Supervisor

log = logging.getLogger("yard.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``yard serve``."""
    parser.add_argument(
        "--config",
        type=Path,
        default=Path("yard.toml"),
        metavar="FILE",
        help="the configuration file (default: yard.toml)",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="where to listen, overriding [server] listen in the file",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="jobs, profiles, logs and pid files, overriding [server] data_dir",
    )


def run(args: argparse.Namespace) -> int:
    """Run the gateway until SIGINT/SIGTERM. Exit status 2 for a bad configuration."""
    try:
        config = load_config(args.config).with_overrides(listen=args.listen, data_dir=args.data_dir)
    except ConfigError as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # One line per health poll of a starting backend is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        trio.run(serve, config)
    except ConfigError as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 2
    except CannotListen as exc:
        print(f"yard: {exc}", file=sys.stderr)
        return 1
    return 0


class CannotListen(Exception):
    """The HTTP address is taken (or not ours to bind); nothing was started."""


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            return None
        raise


def _open_meter() -> Any:
    memory = _optional("yard.memory")
    factory = getattr(memory, "default_meter", None)
    if factory is None:
        log.warning("yard.memory is not available: running without a memory meter")
        return None
    return factory()


async def serve(
    config: Config,
    *,
    task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run yard with ``config`` until SIGINT/SIGTERM (or cancellation).

    Reports its :class:`Runtime` (``runtime.urls``: where it listens) once
    ``/healthz`` answers. Raises :class:`CannotListen` when the address is
    taken (before anything is started).
    Raises :class:`ConfigError` when the configuration does not match this
    machine (a GPU it names is not there).
    """
    # Claim the port before anything else: a second yard started by mistake
    # must fail here, before it touches backends or data.
    host, port = config.server.listen_host, config.server.listen_port
    try:
        listeners = await open_listeners(host, port)
    except OSError as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    try:
        await _serve(config, listeners, task_status=task_status)
    finally:
        for listener in listeners:
            listener.socket.close()


async def _serve(
    config: Config,
    listeners: list[trio.SocketListener],
    *,
    task_status: trio.TaskStatus[Runtime],
) -> None:
    config.server.data_dir.mkdir(parents=True, exist_ok=True)
    meter = _open_meter()
    totals: Mapping[str, int] = meter.device_totals() if meter is not None else {}
    devices = config.device_specs(totals)
    if meter is not None and getattr(meter, "mode", "") == "host-only":
        log.warning("%s", getattr(meter, "mode_detail", "host-only mode"))
    scheduler = Scheduler(devices, config.backend_specs(), config.scheduler)

    def start_timeout(backend: str) -> float:
        profile = scheduler.profile(backend)
        return config.backends[backend].startup_timeout(profile.load_s if profile else None)

    stop = trio.Event()
    async with AsyncExitStack() as stack:
        if meter is not None and hasattr(meter, "close"):
            stack.callback(meter.close)
        nursery = await stack.enter_async_context(trio.open_nursery())
        nursery.start_soon(_watch_signals, stop, nursery.cancel_scope)

        supervisor = Supervisor(config)
        await nursery.start(supervisor.run)

        profiles = None
        profiles_module = _optional("yard.memory.profiles")
        if profiles_module is not None:
            describe = getattr(meter, "describe", None)
            labels = describe() if callable(describe) else None
            profiles = await profiles_module.open_profile_store(config, devices=labels)
            stack.push_async_callback(_shielded_close, profiles)

        engine = Engine(
            scheduler=scheduler,
            launcher=supervisor,
            meter=meter,
            profiles=profiles,
            start_timeout_s=start_timeout,
            shutdown_grace_s=max(30.0, 2 * config.server.stop_grace_s),
        )
        await nursery.start(engine.run)

        runtime = Runtime(config=config, engine=engine, launcher=supervisor, started_at=time.time())
        jobs_module = _optional("yard.jobs")
        if jobs_module is not None and hasattr(jobs_module, "open_jobs"):
            jobs = await stack.enter_async_context(
                jobs_module.open_jobs(
                    engine=engine, data_dir=config.server.data_dir, pool=runtime.upstream
                )
            )
            runtime.jobs = jobs
            await nursery.start(jobs.run)
        else:
            log.warning("yard.jobs is not available: 'Prefer: respond-async' answers 501")

        binds = await nursery.start(_serve_http, runtime, listeners, stop)
        runtime.urls = binds
        log.info("yard is serving on %s (data in %s)", ", ".join(binds), config.server.data_dir)
        task_status.started(runtime)
        # The HTTP server returns once stop is set and its grace is over;
        # then everything else winds down (backends stopped, shielded).
        await stop.wait()
        await _wait_http_done(runtime)
        nursery.cancel_scope.cancel()
    log.info("yard stopped")


async def _serve_http(
    runtime: Runtime,
    listeners: list[trio.SocketListener],
    stop: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    done = runtime.extras.setdefault("http_done", trio.Event())
    server = runtime.config.server
    try:
        await serve_app(
            create_app(runtime),
            server.listen_host,
            server.listen_port,
            shutdown_trigger=stop.wait,
            graceful_s=server.stop_grace_s,
            listeners=listeners,
            task_status=task_status,
        )
    finally:
        runtime.upstream.close_idle()
        done.set()


async def _wait_http_done(runtime: Runtime) -> None:
    done = runtime.extras.get("http_done")
    if isinstance(done, trio.Event):
        await done.wait()


async def _shielded_close(resource: Any) -> None:
    with trio.CancelScope(shield=True):
        await resource.aclose()


async def _watch_signals(stop: trio.Event, everything: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if not stop.is_set():
                log.info("%s: shutting down gracefully", signal.Signals(signum).name)
                stop.set()
            else:
                # No more grace for requests; backends are still stopped
                # (that cleanup is shielded and has its own deadline).
                log.warning("second signal: stopping now")
                everything.cancel()

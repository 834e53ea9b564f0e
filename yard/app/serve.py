"""``yard serve``: run the gateway.

The nursery tree (``docs/architecture.md``, "The composition root"), each part started with
``nursery.start`` and ready only once it really is:

1. the supervisor: reaps backends a killed yard left behind, then launches;
2. the meter (``yard.memory.default_meter``: host RAM, plus GPUs via NVML);
3. the profile store (``data_dir/profiles.sqlite``; with ``[cluster]``, the
   shared database, opened and migrated here);
4. the engine, which owns the scheduler core;
5. the job service (``data_dir/jobs.sqlite``, settings from ``[jobs]``);
   with ``[cluster]``, the shared queue in PostgreSQL and this node
   (:mod:`yard.cluster.node`: heartbeats, claims, dead nodes, forwarding);
6. the HTTP server: data plane and control plane on one port.

What yard does is logged at INFO (``server.log_level``, default ``info``):
the core's decisions to start or stop a backend and to reject or requeue a
request, each with the core's reason, and what became of each backend
process: ready, stopped, exited on its own, failed to start
(:mod:`yard.observe.activity`).

Each part is handed the services it uses when it is built, in that order;
the HTTP side gets them as one :class:`~yard.app.web.Parts` record, built
once every service exists (``docs/architecture.md``).

SIGHUP (``yard reload``) reads the configuration again and applies it without
a restart (:mod:`yard.app.reload`); until this release it stopped yard like
SIGTERM. SIGINT or SIGTERM starts a graceful shutdown: the HTTP server stops
accepting and gives in-flight requests ``server.stop_grace_s``; then the job
service, the engine and the supervisor stop every backend (SIGTERM to its
group, SIGKILL after its grace). A second signal cuts both graces short
(SIGKILL at once). Either way yard exits only once every backend's process
group is gone: the signals stay caught until then (:class:`Shutdown`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import trio

from yard import compiled, datadir, modelfolder
from yard.announce.service import announcement_service
from yard.app.reload import Reloader
from yard.app.web import Parts, Web, serve_app
from yard.batches.service import open_batches
from yard.cluster.batches import ClusterBatchStore
from yard.cluster.node import open_database, open_node
from yard.cluster.profiles import cluster_key
from yard.config import Config, ConfigError, default_config, exposure, is_loopback, load_config
from yard.core import Scheduler
from yard.db import DatabaseError
from yard.engine import Engine
from yard.h1.server import Server, ServerStatistics, open_listeners
from yard.h1.upstream import UpstreamPool
from yard.jobs import JOBS_FILE, JobStore, open_jobs
from yard.memory import default_meter
from yard.memory.prior import with_priors
from yard.memory.profiles import Profiles, open_profile_store
from yard.observe import MeterInfo
from yard.observe.activity import LoggingLauncher, log_decisions, logged_kinds
from yard.ports import MachineMeter
from yard.supervisor import Supervisor
from yard.testing.gpu import nvml_from_env

log = logging.getLogger("yard.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``yard serve``."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="the configuration file (default: yard.toml; with --models and no yard.toml "
        "here, none: every default)",
    )
    parser.add_argument(
        "--models",
        type=Path,
        metavar="DIR",
        help="serve every GGUF file in DIR as a model named after its file "
        "(overrides [models] dir)",
    )
    parser.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="MODEL=NAME",
        help="another name for a model of --models (repeatable)",
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
        config = _config(args)
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
        trio.run(functools.partial(serve, config, freeze_heap=True, load=lambda: _config(args)))
    except ConfigError as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 2
    except (CannotListen, datadir.DataDirInUse) as exc:
        print(f"yard: {exc}", file=sys.stderr)
        return 1
    except DatabaseError as exc:
        # Only a cluster node has a database it cannot do without at start.
        print(f"yard: the cluster's database ([cluster] database): {exc}", file=sys.stderr)
        return 1
    return 0


def _config(args: argparse.Namespace) -> Config:
    """The configuration ``yard serve``'s options ask for. Raises ConfigError."""
    path: Path | None = args.config
    if path is None:
        path = Path("yard.toml")
        if args.models is not None and not path.exists():
            # yard serve --models DIR alone: every default, data in the
            # user's data directory (not wherever the command was typed).
            config = default_config(Path.cwd() / "(command line)")
            data_dir = args.data_dir or _user_data_dir()
            return config.with_overrides(
                listen=args.listen, data_dir=data_dir, models=args.models, aliases=args.alias
            )
    return load_config(path).with_overrides(
        listen=args.listen, data_dir=args.data_dir, models=args.models, aliases=args.alias
    )


def _user_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "yard"


class CannotListen(Exception):
    """The HTTP address is taken (or not ours to bind); nothing was started."""


@dataclass(frozen=True, kw_only=True)
class Running:
    """What :func:`serve` reports once yard serves.

    urls: where it listens (``["http://127.0.0.1:8080"]``).
    parts: what it serves (the engine, the supervisor, the job service...).
    """

    urls: list[str]
    parts: Parts


async def serve(
    config: Config,
    *,
    freeze_heap: bool = False,
    load: Callable[[], Config] | None = None,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run yard with ``config`` until SIGINT/SIGTERM (or cancellation).

    ``freeze_heap`` (for a process that runs yard alone, as ``yard serve``):
    once started, move every object built so far (modules, the apps, the
    configuration) out of the garbage collector's sight with
    :func:`gc.freeze`, so that its full collections, every few hundred
    requests, scan only what requests left behind and not the whole heap.

    ``load`` reads the configuration again for ``yard reload`` and SIGHUP
    (default: the file ``config`` came from, without command-line overrides).

    Reports :class:`Running` (``urls``: where it listens) once ``/healthz``
    answers. Raises :class:`CannotListen` when the address is
    taken (before anything is started).
    Raises :class:`ConfigError` when the configuration does not match this
    machine (a GPU it names is not there), and
    :class:`yard.datadir.DataDirInUse` when another yard holds its data
    directory (after the port was claimed, before anything is started).
    """
    # The stop signals stay caught until serve returns: a signal's default
    # action would end yard with its backends still running (orphans).
    with trio.open_signal_receiver(*stop_signals()) as signals:
        # Claim the port before anything else: a second yard started by
        # mistake must fail here, before it touches backends or data.
        host, port = config.server.listen_host, config.server.listen_port
        try:
            listeners = await open_listeners(host, port)
        except OSError as exc:
            raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        try:
            # One yard per data directory (yard.datadir): a second one on
            # another port must not restore the first one's jobs or load
            # its models again. The kernel drops the lock when we die.
            with datadir.hold(
                config.server.data_dir, command="yard serve", listen=f"{host}:{port}"
            ):
                await _serve(
                    config,
                    listeners,
                    signals,
                    freeze_heap=freeze_heap,
                    load=load or functools.partial(load_config, config.path),
                    task_status=task_status,
                )
        finally:
            for listener in listeners:
                listener.socket.close()


async def _serve(
    config: Config,
    listeners: list[trio.SocketListener],
    signals: AsyncIterator[int],
    *,
    freeze_heap: bool,
    load: Callable[[], Config],
    task_status: trio.TaskStatus[Running],
) -> None:
    config.server.data_dir.mkdir(parents=True, exist_ok=True)
    # Tests name a shared fake card in $YARD_TESTING_FAKE_GPU (none otherwise).
    meter: MachineMeter = default_meter(nvml=nvml_from_env())
    base = config
    # [models]: every GGUF file of the folder, on the GPUs found here.
    config, skipped = await trio.to_thread.run_sync(
        modelfolder.scan, config, tuple(meter.device_totals())
    )
    for line in skipped:
        log.warning("models: %s", line)
    if config.folder is not None:
        log.info(
            "models: %d in %s (%s)",
            len(config.from_folder),
            config.folder.dir,
            ", ".join(sorted(config.from_folder)) or "none yet",
        )
    per_process = meter.per_process_devices()
    devices = [
        dataclasses.replace(spec, per_process=spec.name in per_process)
        for spec in config.device_specs(meter.device_totals())
    ]
    scheduler = Scheduler(
        devices,
        with_priors(config, config.backend_specs()),
        config.scheduler,
        max_concurrent={
            app.name: app.max_concurrent
            for app in config.apps.values()
            if app.max_concurrent is not None
        },
        # Only apps that set a weight turn the fairness term on (1 is the default).
        weights={app.name: app.weight for app in config.apps.values() if app.weight != 1.0},
    )

    def start_timeout(backend: str) -> float:
        profile = scheduler.profile(backend)
        # The supervisor holds the configuration running now (yard reload).
        running = supervisor.config.backends[backend]
        return running.startup_timeout(profile.load_s if profile else None)

    # A node reaches its cluster's database before it starts anything: without
    # it, it has nothing to serve from (raises DatabaseError).
    cluster_db = None if config.cluster is None else await open_database(config.cluster)
    shutdown = Shutdown()
    stop = shutdown.requested
    async with AsyncExitStack() as stack:
        if cluster_db is not None:
            stack.push_async_callback(_shielded_close, cluster_db.close)
        stack.callback(meter.close)
        nursery = await stack.enter_async_context(trio.open_nursery())
        supervisor = Supervisor(config)
        shutdown.attach(nursery.cancel_scope, hurry=supervisor.hurry)
        watcher: trio.CancelScope = await nursery.start(_watch_signals, signals, shutdown)
        try:
            await nursery.start(_supervise, supervisor, watcher)
        except BaseException:
            watcher.cancel()
            raise

        profiles: Profiles
        if config.cluster is None or cluster_db is None:
            profiles = await open_profile_store(config, devices=meter.describe())
        else:
            # A node: profiles, jobs and the registry in the shared database;
            # one measurement serves every node with the same GPU model.
            profiles = Profiles(
                cluster_db,
                config,
                devices=meter.describe(),
                portable=cluster_key,
                node=config.cluster.node,
            )
        stack.push_async_callback(_shielded_close, profiles.aclose)

        engine = Engine(
            scheduler=scheduler,
            launcher=LoggingLauncher(supervisor),
            meter=meter,
            profiles=profiles,
            logs=supervisor,
            start_timeout_s=start_timeout,
            shutdown_grace_s=max(30.0, 2 * config.server.stop_grace_s),
            max_queued={
                app.name: app.max_queued
                for app in config.apps.values()
                if app.max_queued is not None
            },
        )
        nursery.start_soon(log_decisions, engine, engine.subscribe(logged_kinds()), stop)
        await nursery.start(engine.run)

        pool = UpstreamPool()
        node = None
        if cluster_db is None:
            jobs = await stack.enter_async_context(
                open_jobs(
                    engine=engine,
                    data_dir=config.server.data_dir,
                    pool=pool,
                    config=config.jobs,
                )
            )
            await nursery.start(jobs.run)
            batches = await stack.enter_async_context(open_batches(jobs, config))
            await nursery.start(batches.run)
            local_store = jobs.store
        else:
            # A node of a cluster: jobs, files and batches in the shared
            # database (PostgreSQL); announcements stay this node's own, in
            # its SQLite file.
            node, jobs = await stack.enter_async_context(
                open_node(
                    config=config,
                    db=cluster_db,
                    engine=engine,
                    pool=pool,
                    gpu_models=[
                        label for name, label in meter.describe().items() if name != "host"
                    ],
                )
            )
            await nursery.start(jobs.run)
            await nursery.start(node.run)
            batches = await stack.enter_async_context(
                open_batches(jobs, config, ClusterBatchStore(node.store))
            )
            await nursery.start(batches.run)
            local_store = await JobStore.open(config.server.data_dir / JOBS_FILE)
            stack.push_async_callback(_shielded_close, local_store.close)
        announcements = announcement_service(engine, local_store, config)
        await nursery.start(announcements.run)

        # The HTTP server exists only once it serves; /metrics asks it then.
        http: list[Server] = []

        def http_statistics() -> ServerStatistics | None:
            return http[0].statistics() if http else None

        parts = Parts(
            config=config,
            engine=engine,
            pool=pool,
            launcher=supervisor,
            jobs=jobs,
            batches=batches,
            announcements=announcements,
            started_at=time.time(),
            stopping=stop,
            profiles=profiles,
            # The meter logged its mode once; the same sentence for the
            # parts that show it (status, /metrics).
            meter=MeterInfo(mode=meter.mode, detail=meter.mode_detail),
            cluster=node,
            http_statistics=http_statistics,
        )
        # The HTTP side: every part it serves, and the configuration that
        # yard reload hands it (app keys, scopes, model names).
        web = Web(parts)

        # yard reload, SIGHUP and the models folder's rescans (yard.app.reload).
        reloader = Reloader(
            load=load,
            base=base,
            current=config,
            gpus=tuple(meter.device_totals()),
            engine=engine,
            supervisor=supervisor,
            profiles=profiles,
            publish=web.use_config,
        )
        await nursery.start(reloader.run)
        nursery.start_soon(_reload_on_hangup, reloader)

        http_done = trio.Event()
        binds = await nursery.start(_serve_http, web, listeners, http.append, http_done)
        log.info("yard is serving on %s (data in %s)", ", ".join(binds), config.server.data_dir)
        log.info("scheduler core: %s", compiled.ACTIVE[1])
        open_to_all = not config.apps and not is_loopback(config.server.listen_host)
        for line in exposure(config):
            log.log(logging.WARNING if open_to_all else logging.INFO, "access: %s", line)
        if freeze_heap:
            gc.collect()
            gc.freeze()
        shutdown.serving()
        task_status.started(Running(urls=binds, parts=parts))
        # The HTTP server returns once stop is set and its grace is over;
        # then everything else winds down (backends stopped, shielded).
        await stop.wait()
        await http_done.wait()
        nursery.cancel_scope.cancel()
    log.info("yard stopped")


async def _serve_http(
    web: Web,
    listeners: list[trio.SocketListener],
    on_server: Callable[[Server], None],
    done: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    parts = web.parts
    server = parts.config.server
    try:
        await serve_app(
            web.app,
            server.listen_host,
            server.listen_port,
            shutdown_trigger=parts.stopping.wait,
            graceful_s=server.stop_grace_s,
            listeners=listeners,
            server_config=server,
            on_server=on_server,
            task_status=task_status,
        )
    finally:
        parts.pool.close_idle()
        done.set()


async def _shielded_close(close: Callable[[], Awaitable[None]]) -> None:
    with trio.CancelScope(shield=True):
        await close()


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop ``yard serve``: SIGINT and SIGTERM. (SIGHUP
    reloads the configuration: :func:`_reload_on_hangup`.)"""
    return (signal.SIGINT, signal.SIGTERM)


async def _reload_on_hangup(reloader: Reloader) -> None:
    """SIGHUP: read the configuration again (``yard reload`` sends it). It
    used to stop yard like SIGTERM."""
    with trio.open_signal_receiver(signal.SIGHUP) as hangups:
        async for _ in hangups:
            await reloader.reload("SIGHUP")


class Shutdown:
    """What the stop signals (:func:`stop_signals`) do to ``yard serve``,
    from its start until every backend is gone.

    The first signal asks for a graceful stop: :attr:`requested` is set, the
    HTTP server stops accepting and gives in-flight requests
    ``server.stop_grace_s``, then every backend is stopped (SIGTERM to its
    group, SIGKILL after its ``stop_grace_s``). Before yard serves there is
    nothing to be graceful about: start-up is cancelled at once and what was
    started is stopped. Every later signal hurries: in-flight requests are
    cut and every backend group gets SIGKILL now
    (:meth:`yard.supervisor.Supervisor.hurry`). No signal ends yard before
    its backends are gone.
    """

    def __init__(self) -> None:
        self.requested = trio.Event()
        self.signals = 0
        self._scope: trio.CancelScope | None = None
        self._hurry: Callable[[], None] | None = None
        self._serving = False

    def attach(self, everything: trio.CancelScope, *, hurry: Callable[[], None]) -> None:
        """The scope that holds every part of yard, and what skips the
        backends' grace (the supervisor's ``hurry``)."""
        self._scope = everything
        self._hurry = hurry

    def serving(self) -> None:
        """Yard serves: from now on the first signal is a graceful stop."""
        self._serving = True

    def signal(self, name: str) -> None:
        """React to the signal called ``name`` (``"SIGTERM"``)."""
        self.signals += 1
        if self.signals == 1:
            log.info("%s: shutting down gracefully", name)
            self.requested.set()
            if not self._serving and self._scope is not None:
                self._scope.cancel()
            return
        log.warning(
            "%s again: stopping now (requests cut, SIGKILL to every backend); "
            "yard exits once every backend process is gone",
            name,
        )
        if self._scope is not None:
            self._scope.cancel()
        if self._hurry is not None:
            self._hurry()


async def _watch_signals(
    signals: AsyncIterator[int],
    shutdown: Shutdown,
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    # Shielded: a second signal must still hurry the backends' stop after
    # everything else was cancelled. It ends when the supervisor is done
    # (see _supervise), which reports the scope to cancel.
    with trio.CancelScope(shield=True) as scope:
        task_status.started(scope)
        async for signum in signals:
            shutdown.signal(signal.Signals(signum).name)


async def _supervise(
    supervisor: Supervisor,
    watcher: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the supervisor; once it returns, every backend is gone and the
    signal watcher may end."""
    try:
        await supervisor.run(task_status=task_status)
    finally:
        watcher.cancel()

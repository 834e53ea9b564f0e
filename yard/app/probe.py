"""``yard probe MODEL --config FILE [--json]``: measure one model on demand.

It starts the backend serving MODEL (a model name or a backend name) alone,
through the same supervisor ``yard serve`` uses, samples its memory every
200 ms through start-up, its configured warm-up and a worst-case request
(a prompt that fills a slot's context, as ``warmup.fill_context`` says:
``"auto"`` for llama-server), stops it, prints what it
needs and where that fits next to the pinned backends, and stores the
profile, so ``yard serve`` does not measure it again.

Exit status: 0 measured; 1 the backend failed (start-up, warm-up, timeout);
2 bad configuration or arguments; 3 a running yard uses the same data
directory (probing would fight it for its backends' pid files).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import trio
from rich.console import Console
from rich.live import Live
from rich.table import Table

from yard import datadir
from yard.config import BackendConfig, Config, ConfigError, load_config
from yard.core import resources
from yard.core.spec import HOST, Profile
from yard.memory.measure import Measurement, Phase, measure_profile
from yard.memory.meter import MachineMeter, default_meter
from yard.memory.profiles import open_profile_store
from yard.memory.readings import DeviceDetail, format_bytes
from yard.memory.warmup import FillProgress, fill_llama_context
from yard.ports import BackendStartError
from yard.testing.gpu import nvml_from_env


class ContextFillFailed(Exception):
    """The worst-case request of a probe failed (the server refused it, or
    answered something that is not llama-server's API)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """Whether a measured backend fits on one device.

    need_bytes: its reservation (peak × margin). others_bytes: what the
    device must keep for others: the larger of its use just before the probe
    and the pinned backends' reservations there. available_bytes: total minus
    reserve minus others.
    """

    device: str
    need_bytes: int
    total_bytes: int
    reserve_bytes: int
    others_bytes: int
    pinned: tuple[str, ...]

    @property
    def available_bytes(self) -> int:
        return max(0, self.total_bytes - self.reserve_bytes - self.others_bytes)

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.available_bytes


def fit_report(
    measurement: Measurement,
    *,
    candidates: Sequence[str],
    totals: Mapping[str, int],
    reserves: Mapping[str, int],
    pinned: Mapping[str, tuple[Profile, tuple[str, ...]]],
    margin: float,
) -> list[Fit]:
    """Where the measured backend fits: host RAM, and each GPU in
    ``candidates`` (the GPUs it may be placed on). ``pinned``: each pinned
    backend's stored profile and the GPUs it may use (it is counted on all of
    them: where it lands is not known in advance)."""
    before = {detail.device: detail for detail in measurement.before}
    fits = []
    for device in [HOST, *candidates]:
        if device not in totals:
            continue
        if device == HOST:
            need = int(measurement.peak_bytes.get(HOST, 0) * margin)
            holders = {name: int(p.host_bytes * margin) for name, (p, _) in pinned.items()}
        else:
            need = int(measurement.peak_gpu_bytes * margin)
            holders = {
                name: int(p.gpu_bytes * margin)
                for name, (p, gpus) in pinned.items()
                if device in gpus
            }
        used_before = before[device].used_bytes if device in before else 0
        fits.append(
            Fit(
                device=device,
                need_bytes=need,
                total_bytes=totals[device],
                reserve_bytes=reserves.get(device, 0),
                others_bytes=max(used_before, sum(holders.values())),
                pinned=tuple(sorted(holders)),
            )
        )
    return fits


def context_fill(
    backend: BackendConfig,
    *,
    no_fill: bool,
    on_progress: Callable[[FillProgress], None] | None = None,
) -> Callable[[str], Awaitable[None]] | None:
    """The worst-case request the probe sends after the configured warm-up,
    or None: as the backend's ``warmup.fill_context`` says (``"auto"``: when
    its command looks like llama-server), never with ``--no-fill``.

    The probe fills the context itself and launches without ``measure``, so
    the supervisor does not fill it a second time. A failed fill raises
    :class:`ContextFillFailed`, naming the switches that skip it.
    ``on_progress`` hears the server's progress reports.
    """
    from yard.supervisor import fills_context  # the supervisor's rule, one place

    if not fills_context(backend, backend.command, measure=not no_fill):
        return None

    async def fill(base_url: str) -> None:
        try:
            await fill_llama_context(base_url, on_progress)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise ContextFillFailed(
                f"the context fill failed ({exc!r}); set warmup.fill_context = false "
                "or pass --no-fill to measure without it"
            ) from exc

    return fill


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a model name or a backend name")
    parser.add_argument("--config", required=True, type=Path, help="the yard TOML file")
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    parser.add_argument(
        "--gpus",
        default=None,
        help="comma-separated GPUs to place it on (default: the first of its gpus)",
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="use this data directory instead"
    )
    parser.add_argument(
        "--interval", type=float, default=0.2, help="seconds between samples (0.1-0.25)"
    )
    parser.add_argument(
        "--settle", type=float, default=1.0, help="seconds to wait after warm-up for steady state"
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds before giving up (default: start-up)"
    )
    parser.add_argument(
        "--no-fill",
        action="store_true",
        help="skip the context-filling request after the configured warm-up "
        '(sent as warmup.fill_context says; "auto": llama-server only)',
    )
    parser.add_argument("--no-store", action="store_true", help="measure, but store nothing")


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for line in exc.errors:
            err.print(line, markup=False, highlight=False)
        return 2
    except OSError as exc:
        err.print(f"yard probe: cannot read {args.config}: {exc}", markup=False)
        return 2
    if args.data_dir is not None:
        server = replace(config.server, data_dir=args.data_dir.resolve())
        config = replace(config, server=server)
    backend = config.backend_for_model(args.model) or config.backends.get(args.model)
    if backend is None:
        known = ", ".join(sorted(config.backends)) or "none"
        err.print(
            f"yard probe: {args.model!r} is neither a model nor a backend in {config.path} "
            f"(backends: {known})",
            markup=False,
        )
        return 2
    if not 0.05 <= args.interval <= 1.0:
        err.print("yard probe: --interval must be between 0.05 and 1 second", markup=False)
        return 2
    try:
        # One yard per data directory (yard.datadir): a probe starts the
        # backend and writes its profile, as yard serve would.
        with datadir.hold(config.server.data_dir, command="yard probe"):
            meter = default_meter(nvml=nvml_from_env())
            try:
                return trio.run(_probe, config, backend, args, meter, err)
            finally:
                meter.close()
    except datadir.DataDirInUse as exc:
        err.print(f"yard probe: {exc}", markup=False)
        return 3


def _placement(backend: BackendConfig, args: argparse.Namespace) -> tuple[str, ...]:
    if args.gpus is not None:
        return tuple(g.strip() for g in args.gpus.split(",") if g.strip())
    return backend.gpus[: backend.gpu_count] if backend.gpus else ()


async def _probe(
    config: Config,
    backend: BackendConfig,
    args: argparse.Namespace,
    meter: MachineMeter,
    err: Console,
) -> int:
    from yard.supervisor import Supervisor  # the real launcher, only when probing

    totals = meter.device_totals()
    gpus = _placement(backend, args)
    missing = [gpu for gpu in gpus if gpu not in totals]
    if missing:
        err.print(
            f"yard probe: {backend.name} is placed on {', '.join(missing)}, which this machine "
            f"does not have ({meter.mode_detail})",
            markup=False,
        )
        return 2
    display = _Display(err, backend.name, quiet=args.json)
    fill = context_fill(backend, no_fill=args.no_fill, on_progress=display.warming)
    store = await open_profile_store(config, devices=meter.describe())
    try:
        async with trio.open_nursery() as nursery:
            # The guard above made sure no yard runs on this data directory;
            # its pid files are still no business of a probe.
            supervisor = Supervisor(config, reap_orphans=False)
            await nursery.start(supervisor.run)
            timeout = args.timeout or backend.startup_timeout(None)
            try:
                # Ranges are measured at their ends, along the path the
                # scheduler chooses on (resources: the context first, then
                # the slots): the lines through them are what it chooses by.
                points: list[Measurement] = []
                for context, parallel in resources.path_ends(backend.context, backend.parallel):
                    with display.live(), trio.fail_after(timeout):
                        points.append(
                            await measure_profile(
                                backend=backend.name,
                                gpus=gpus,
                                launcher=supervisor,
                                meter=meter,
                                interval_s=args.interval,
                                warmup=fill,
                                settle_s=args.settle,
                                on_sample=display.update,
                                context=context,
                                parallel=parallel,
                            )
                        )
                measurement = points[-1]
            except (
                BackendStartError,
                ContextFillFailed,
                trio.TooSlowError,
                httpx.HTTPError,
            ) as exc:
                why = (
                    f"no answer within {timeout:g} s" if isinstance(exc, trio.TooSlowError) else exc
                )
                err.print(f"yard probe: {backend.name} failed: {why}", markup=False)
                for line in supervisor.log_lines(backend.name)[-15:]:
                    err.print(f"  | {line}", markup=False, highlight=False)
                nursery.cancel_scope.cancel()
                return 1
            nursery.cancel_scope.cancel()
        pinned: dict[str, tuple[Profile, tuple[str, ...]]] = {}
        for other in config.backends.values():
            if other.pinned and other.name != backend.name:
                stored = await store.get(other.name)
                if stored is not None:
                    pinned[other.name] = (stored, other.gpus)
        margin = config.scheduler.profile_margin
        fits = fit_report(
            measurement,
            candidates=backend.gpus,
            totals=totals,
            reserves={name: device.reserve_bytes for name, device in config.devices.items()},
            pinned=pinned,
            margin=margin,
        )
        unmeasured = sorted(
            b.name for b in config.backends.values() if b.pinned and b.name not in pinned
        )
        key = (await store.key(backend.name)).digest
        profile: Profile | None = None
        for point in points:
            profile = resources.learn(profile, point.profile())
        assert profile is not None
        if not args.no_store:
            await store.store(
                backend.name,
                profile,
                steady_gpu_bytes=measurement.steady_gpu_bytes if gpus else None,
                steady_host_bytes=measurement.steady_bytes.get(HOST),
                source="probe",
            )
    finally:
        await store.aclose()
    report = _report(measurement, fits, margin, meter, key, unmeasured, stored=not args.no_store)
    if backend.context is not None and len(points) > 1:
        report["context"] = {
            "points": {
                str(point.context): {
                    "gpu_bytes": point.peak_gpu_bytes,
                    "host_bytes": point.peak_bytes.get(HOST, 0),
                }
                for point in points
                if point.parallel == points[0].parallel
            },
            "gpu_per_token": profile.gpu_per_token,
            "host_per_token": profile.host_per_token,
        }
    if backend.parallel is not None and len(points) > 1:
        top = points[-1].context
        report["parallel"] = {
            "context": top,
            "points": {
                str(point.parallel): {
                    "gpu_bytes": point.peak_gpu_bytes,
                    "host_bytes": point.peak_bytes.get(HOST, 0),
                }
                for point in points
                if point.context == top
            },
            "gpu_per_slot": profile.gpu_per_slot,
            "host_per_slot": profile.host_per_slot,
        }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(Console(), report)
    return 0


class _Display:
    """The live progress line while the backend loads and warms up."""

    def __init__(self, console: Console, backend: str, *, quiet: bool) -> None:
        self._console = console
        self._backend = backend
        self._quiet = quiet
        self._live: Live | None = None
        self._started = 0.0
        self._peaks: dict[str, int] = {}
        self._warmup = ""

    def live(self) -> contextlib.AbstractContextManager[object]:
        """The live display (nothing when quiet or not on a terminal)."""
        self._started = trio.current_time()
        if self._quiet or not self._console.is_terminal:
            return contextlib.nullcontext()
        self._live = Live(
            self._render("before", []),
            console=self._console,
            refresh_per_second=8,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        return self._live

    def warming(self, progress: FillProgress) -> None:
        """A progress report of the context fill: shown in the title, and
        printed as a line when there is no live display."""
        self._warmup = progress.describe()
        if self._live is None and not self._quiet:
            self._console.print(f"{self._backend}: {self._warmup}", markup=False)

    def update(self, phase: Phase, details: list[DeviceDetail]) -> None:
        for detail in details:
            usage = detail.backends.get(self._backend)
            if usage is not None:
                self._peaks[detail.device] = max(
                    self._peaks.get(detail.device, 0), usage.held_bytes
                )
        if self._live is not None:
            self._live.update(self._render(phase, details))

    def _render(self, phase: Phase, details: list[DeviceDetail]) -> Table:
        elapsed = trio.current_time() - self._started
        doing = self._warmup if phase == "warm-up" and self._warmup else phase
        table = Table(
            title=f"probing {self._backend}: {doing} ({elapsed:.1f} s)", title_justify="left"
        )
        for column in ("device", "now", "peak", "device used"):
            table.add_column(column, justify="left" if column == "device" else "right")
        for detail in details:
            usage = detail.backends.get(self._backend)
            table.add_row(
                detail.device,
                format_bytes(usage.held_bytes) if usage else "-",
                format_bytes(self._peaks.get(detail.device, 0)),
                f"{format_bytes(detail.used_bytes)} / {format_bytes(detail.total_bytes)}",
            )
        return table


def _report(
    m: Measurement,
    fits: list[Fit],
    margin: float,
    meter: MachineMeter,
    key: str,
    unmeasured_pinned: list[str],
    *,
    stored: bool,
) -> dict[str, object]:
    devices = {}
    for device in sorted(set(m.peak_bytes) | set(m.steady_bytes), key=lambda d: (d != HOST, d)):
        peak = m.peak_bytes.get(device, 0)
        devices[device] = {
            "peak_bytes": peak,
            "steady_bytes": m.steady_bytes.get(device, 0),
            "reservation_bytes": int(peak * margin),
            "attribution": m.attribution.get(device, "none"),
        }
    profile = m.profile()
    return {
        "backend": m.backend,
        "gpus": list(m.gpus),
        "load_s": round(m.load_s, 3),
        "warmup_s": None if m.warmup_s is None else round(m.warmup_s, 3),
        "samples": m.samples,
        "devices": devices,
        "reclaimable_host_bytes": m.reclaimable_bytes,
        "profile": {
            "gpu_bytes": profile.gpu_bytes,
            "host_bytes": profile.host_bytes,
            "load_s": round(profile.load_s, 3),
            "margin": margin,
        },
        "fits": [
            {
                "device": f.device,
                "fits": f.fits,
                "need_bytes": f.need_bytes,
                "available_bytes": f.available_bytes,
                "total_bytes": f.total_bytes,
                "reserve_bytes": f.reserve_bytes,
                "others_bytes": f.others_bytes,
                "pinned": list(f.pinned),
            }
            for f in fits
        ],
        "pinned_without_profile": unmeasured_pinned,
        "meter": meter.mode_detail,
        "notes": list(m.notes),
        # what llama-server took (/props), where it differs from the command
        "server_context": m.took.context if m.took is not None else None,
        "server_slots": m.took.slots if m.took is not None else None,
        "profile_key": key,
        "stored": stored,
    }


def _print_table(console: Console, report: Mapping[str, object]) -> None:
    gpus = report["gpus"]
    placed = f" on {', '.join(gpus)}" if isinstance(gpus, list) and gpus else " (host only)"
    warm = report["warmup_s"]
    timing = f"loaded in {report['load_s']} s" + (f", worst-case warm-up {warm} s" if warm else "")
    console.print(f"[bold]{report['backend']}[/bold]{placed}: {timing}")
    table = Table(title="memory", title_justify="left")
    for column in ("device", "steady", "peak", "reservation", "measured by"):
        table.add_column(column, justify="left" if column in ("device", "measured by") else "right")
    devices = report["devices"]
    assert isinstance(devices, dict)
    for device, figures in devices.items():
        table.add_row(
            device,
            format_bytes(figures["steady_bytes"]),
            format_bytes(figures["peak_bytes"]),
            format_bytes(figures["reservation_bytes"]),
            figures["attribution"],
        )
    console.print(table)
    span = report.get("context")
    if isinstance(span, dict):
        points = "; ".join(
            f"context {c}: {format_bytes(f['gpu_bytes'])} GPU, {format_bytes(f['host_bytes'])} host"
            for c, f in span["points"].items()
        )
        slopes = (
            f"{(span['gpu_per_token'] or 0) / 1024:.1f} KiB GPU, "
            f"{(span['host_per_token'] or 0) / 1024:.1f} KiB host per token of context"
        )
        console.print(f"{points}: {slopes}")
    slots = report.get("parallel")
    if isinstance(slots, dict):
        points = "; ".join(
            f"{p} slots: {format_bytes(f['gpu_bytes'])} GPU, {format_bytes(f['host_bytes'])} host"
            for p, f in slots["points"].items()
        )
        slopes = (
            f"{format_bytes(round(slots['gpu_per_slot'] or 0))} GPU, "
            f"{format_bytes(round(slots['host_per_slot'] or 0))} host per slot"
        )
        at = f" (at context {slots['context']})" if slots["context"] is not None else ""
        console.print(f"{points}{at}: {slopes}")
    reclaimable = report["reclaimable_host_bytes"]
    assert isinstance(reclaimable, int)
    if reclaimable:
        console.print(
            f"plus {format_bytes(reclaimable)} of file-backed pages (mmap'd model), reclaimable"
        )
    elif not gpus:
        console.print(
            "host figures include its file-backed pages: a CPU backend computes on its mmap'd model"
        )
    fit_table = Table(title="where it fits", title_justify="left")
    for column in ("device", "fits", "needs", "available", "next to"):
        fit_table.add_column(
            column, justify="left" if column in ("device", "fits", "next to") else "right"
        )
    fits = report["fits"]
    assert isinstance(fits, list)
    for fit in fits:
        fit_table.add_row(
            fit["device"],
            "[green]yes[/green]" if fit["fits"] else "[red]no[/red]",
            format_bytes(fit["need_bytes"]),
            format_bytes(fit["available_bytes"]),
            ", ".join(fit["pinned"]) or "-",
        )
    console.print(fit_table)
    pending = report["pinned_without_profile"]
    if isinstance(pending, list) and pending:
        console.print(f"pinned backends not measured yet (not counted): {', '.join(pending)}")
    notes = report["notes"]
    if isinstance(notes, list):
        for note in notes:
            console.print(f"note: {note}", markup=False)
    if report.get("server_context") is not None or report.get("server_slots") is not None:
        console.print(
            f"the server took context {report.get('server_context')} and "
            f"{report.get('server_slots')} slot(s) (its /props)",
            markup=False,
        )
    console.print(str(report["meter"]), markup=False)
    stored = "stored" if report["stored"] else "not stored (--no-store)"
    console.print(f"profile {stored} (key {str(report['profile_key'])[:12]})")

"""A real PostgreSQL server for the cluster tests and benchmarks, started and
stopped by them.

Rules this module keeps:

- The server is Debian's (``/usr/lib/postgresql/<version>/bin``, the newest
  one) or whatever ``initdb`` is on ``PATH``. None at all is an error that
  says to run ``make postgresql``: a missing server never skips tests silently.
- Everything lives in one fresh directory (data, Unix socket, log), in
  memory under ``/dev/shm`` where there is one, else under the system's
  temporary directory, removed on stop. PostgreSQL refuses to
  run as root, so when the tests run as root the directory is handed to the
  ``postgres`` user and the server runs as that user (``setpriv``).
- It listens on a Unix socket in that directory and on 127.0.0.1 at a free
  port, with ``trust`` authentication (loopback only), and without fsync:
  these tests need a real server, not one that survives a power cut. Commits
  still reach the operating system (synchronous commit stays on), so a
  committed row survives :meth:`PostgresServer.stop`, which is a crash.
- ``initdb`` runs once per test process; each server starts from a copy of
  its data directory.
- Every command is bounded in time; :meth:`PostgresServer.stop` is
  ``pg_ctl -m immediate stop`` (the same as a crash, as fast as it gets).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

START_TIMEOUT_S = 60.0
"""Longest wait for initdb, a start or a stop (the machine may be busy)."""

MISSING = (
    "PostgreSQL is not installed (no initdb under /usr/lib/postgresql/*/bin or on PATH); "
    "the cluster tests start a real server of their own: run `make postgresql` "
    "(it installs Debian's postgresql package)"
)


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bin_dir(
    debian: Path = Path("/usr/lib/postgresql"), search_path: str | None = None
) -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: Debian's
    newest version under ``debian``, else the one on ``search_path`` (default
    ``PATH``). Raises :class:`PostgresMissing`, whose message says to run
    ``make postgresql``."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.parent.name))

    found = sorted(debian.glob("*/bin/initdb"), key=version)
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb", path=search_path)
    if on_path is not None:
        return Path(on_path).resolve().parent
    raise PostgresMissing(MISSING)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(slots=True)
class PostgresServer:
    """One running (or stopped) test server. ``port`` is its TCP port on
    127.0.0.1; ``socket_dir`` holds its Unix socket."""

    bin_dir: Path
    root: Path
    port: int
    as_user: str | None
    durable: bool = False

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    @property
    def log_file(self) -> Path:
        return self.root / "postgres.log"

    def dsn(self, dbname: str = "postgres") -> str:
        """A DSN for ``dbname`` over TCP on loopback."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def socket_dsn(self, dbname: str = "postgres") -> str:
        """A DSN for ``dbname`` over the Unix socket."""
        return f"host={self.socket_dir} port={self.port} user=postgres dbname={dbname}"

    def _run(self, args: Sequence[str]) -> None:
        """Run one of the server's programs (as its user)."""
        self._run_as_user([str(self.bin_dir / args[0]), *args[1:]])

    def _run_as_user(self, command: Sequence[str]) -> None:
        if self.as_user is not None:
            command = [
                "setpriv",
                f"--reuid={self.as_user}",
                f"--regid={self.as_user}",
                "--init-groups",
                *command,
            ]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            check=False,
            cwd=self.root,
        )
        if done.returncode != 0:
            log = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
            log = log[-2000:]
            raise RuntimeError(
                f"{' '.join(command)} failed ({done.returncode}): {done.stdout}{done.stderr}\n{log}"
            )

    def start(self) -> None:
        """Start the server (again) and wait until it accepts connections."""
        options = " ".join(
            [
                f"-p {self.port}",
                "-h 127.0.0.1",
                f"-k {self.socket_dir}",
                *(() if self.durable else ("-c fsync=off", "-c full_page_writes=off")),
                "-c shared_buffers=32MB",
                "-c max_connections=200",
                "-c dynamic_shared_memory_type=mmap",
            ]
        )
        self._run(
            [
                "pg_ctl",
                "start",
                "-w",
                "-t",
                str(int(START_TIMEOUT_S)),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                options,
            ]
        )

    def stop(self) -> None:
        """Stop the server at once (``-m immediate``); a stopped one is left be."""
        if (self.data_dir / "postmaster.pid").exists():
            self._run(["pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(self.data_dir)])

    def create_database(self) -> str:
        """A new empty database with a random name; returns its name."""
        name = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending its sessions first. Quiet if the server is down."""
        with (
            contextlib.suppress(psycopg.OperationalError),
            psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10) as conn,
        ):
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


_templates: dict[Path, Path] = {}


def _scratch(*, durable: bool) -> str | None:
    """Where servers keep their files: in memory (``/dev/shm``) when there
    is one, since these servers need no disk; on disk for a durable one."""
    shm = Path("/dev/shm")
    if not durable and shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return None  # the system's temporary directory


def _template(bin_dir: Path, as_user: str | None) -> Path:
    """A freshly initialised data directory for ``bin_dir``'s server, made
    once per process (removed when it exits); servers start from copies."""
    if bin_dir in _templates:
        return _templates[bin_dir]
    root = Path(tempfile.mkdtemp(prefix="yard-pg-template-", dir=_scratch(durable=False)))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    maker = PostgresServer(bin_dir=bin_dir, root=root, port=0, as_user=as_user)
    if as_user is not None:
        user = pwd.getpwnam(as_user)
        os.chown(root, user.pw_uid, user.pw_gid)
    maker._run(
        [
            "initdb",
            "-D",
            str(maker.data_dir),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--wal-segsize=1",
        ]
    )
    _templates[bin_dir] = maker.data_dir
    return maker.data_dir


@contextlib.contextmanager
def start_postgres(*, durable: bool = False) -> Iterator[PostgresServer]:
    """Initialise and start a throw-away server (see the module rules); stop
    it and remove its directory on exit, whatever happened.

    durable: keep PostgreSQL's own defaults (fsync on), for benchmarks that
    should pay what a real server pays per commit.

    Raises :class:`PostgresMissing` (its message says to run ``make
    postgresql``) if the server binaries are not installed.
    """
    bin_dir = find_bin_dir()
    as_user = "postgres" if os.geteuid() == 0 else None
    # Not pytest's tmp_path: its parents are private to root, and the
    # server (running as postgres) must reach its data and socket.
    root = Path(tempfile.mkdtemp(prefix="yard-pg-", dir=_scratch(durable=durable)))
    server = PostgresServer(
        bin_dir=bin_dir, root=root, port=_free_port(), as_user=as_user, durable=durable
    )
    try:
        if as_user is not None:
            user = pwd.getpwnam(as_user)
            os.chown(root, user.pw_uid, user.pw_gid)
        # initdb is most of a start: it runs once per test process, and
        # each server starts from a copy of what it wrote.
        template = _template(bin_dir, as_user)
        server._run_as_user(["cp", "-a", str(template), str(server.data_dir)])
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)

"""A fake ``/proc``: status, stat and environ files for made-up processes."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path


class FakeProc:
    """Writes a procfs-shaped tree under ``root``.

    ``self_nspid`` is the reader's own ``NSpid`` chain (``/proc/self``): a
    chain of two means yard runs one pid namespace below the one ``/proc``
    shows.
    """

    def __init__(self, root: Path, *, self_nspid: Sequence[int] = (1,)) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._write(root / "self", self_nspid[0], 0, self_nspid, 0, 0, 0, {})

    def add(
        self,
        pid: int,
        *,
        ppid: int = 1,
        anon_kib: int = 0,
        shmem_kib: int = 0,
        file_kib: int = 0,
        nspid: Sequence[int] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """A process with these resident figures."""
        self._write(
            self.root / str(pid),
            pid,
            ppid,
            nspid or (pid,),
            anon_kib,
            shmem_kib,
            file_kib,
            environ or {},
        )

    def remove(self, pid: int) -> None:
        """The process exits."""
        shutil.rmtree(self.root / str(pid))

    @staticmethod
    def _write(
        where: Path,
        pid: int,
        ppid: int,
        nspid: Sequence[int],
        anon: int,
        shmem: int,
        file: int,
        environ: Mapping[str, str],
    ) -> None:
        where.mkdir(parents=True, exist_ok=True)
        (where / "status").write_text(
            f"Name:\tfake (x)\nPid:\t{pid}\nPPid:\t{ppid}\n"
            f"NSpid:\t{' '.join(str(p) for p in nspid)}\n"
            f"VmRSS:\t{anon + shmem + file} kB\nRssAnon:\t{anon} kB\n"
            f"RssFile:\t{file} kB\nRssShmem:\t{shmem} kB\n"
        )
        # A name with ") " inside, as the kernel allows, to keep parsing honest.
        (where / "stat").write_text(f"{pid} (fake ) x) S {ppid} {pid} {pid} 0 -1\n")
        (where / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))

"""A fake root with a sysfs of DRM cards and a /proc whose processes hold
DRM clients (fdinfo files filled from tests/memory/fixtures/drm)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.memory.fake_proc import FakeProc

FIXTURES = Path(__file__).parent / "fixtures" / "drm"
KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def fdinfo(kind: str, **fields: object) -> str:
    """A recorded fdinfo shape (``amdgpu-6.12``, ``amdgpu-5.19``, ``xe``,
    ``i915-igpu``) with its ``{fields}`` filled in."""
    return (FIXTURES / f"{kind}.fdinfo").read_text().format(**fields)


class FakeDrm:
    """``root/sys`` (``class/drm/cardN``, render nodes) and ``root/proc``."""

    def __init__(self, root: Path) -> None:
        self.sys = root / "sys"
        (self.sys / "class" / "drm").mkdir(parents=True, exist_ok=True)
        self.proc = FakeProc(root / "proc")

    def card(
        self,
        number: int,
        *,
        slot: str,
        driver: str,
        pci_id: str,
        render: int | None = None,
        vram_total: int | None = None,
        vram_used: int | None = None,
        xe_tiles: tuple[int, ...] = (),
        unique_id: str | None = None,
        product: str | None = None,
    ) -> None:
        """A card (and its render node, if given) with what its driver shows."""
        for name in [f"card{number}"] + ([f"renderD{render}"] if render is not None else []):
            device = self.sys / "class" / "drm" / name / "device"
            device.mkdir(parents=True, exist_ok=True)
            (device / "uevent").write_text(
                f"DRIVER={driver}\nPCI_CLASS=30000\nPCI_ID={pci_id}\n"
                f"PCI_SUBSYS_ID=1DA2:E471\nPCI_SLOT_NAME={slot}\nMODALIAS=pci:v0\n"
            )
            if vram_total is not None:
                (device / "mem_info_vram_total").write_text(f"{vram_total}\n")
            if vram_used is not None:
                (device / "mem_info_vram_used").write_text(f"{vram_used}\n")
            for tile, size in enumerate(xe_tiles):
                (device / f"tile{tile}").mkdir(exist_ok=True)
                (device / f"tile{tile}" / "physical_vram_size_bytes").write_text(f"{size}\n")
            if unique_id is not None:
                (device / "unique_id").write_text(f"{unique_id}\n")
            if product is not None:
                (device / "product_name").write_text(f"{product}\n")
        # A connector, which is not a card.
        (self.sys / "class" / "drm" / f"card{number}-DP-1").mkdir(exist_ok=True)

    def set_vram_used(self, number: int, used: int) -> None:
        device = self.sys / "class" / "drm" / f"card{number}" / "device"
        (device / "mem_info_vram_used").write_text(f"{used}\n")

    def open(self, pid: int, fd: int, text: str, *, node: str = "renderD128") -> None:
        """Process ``pid`` holds fd ``fd`` on ``/dev/dri/<node>`` with this fdinfo."""
        base = self.proc.root / str(pid)
        (base / "fdinfo").mkdir(parents=True, exist_ok=True)
        (base / "fd").mkdir(exist_ok=True)
        (base / "fdinfo" / str(fd)).write_text(text)
        link = base / "fd" / str(fd)
        if link.is_symlink():
            link.unlink()
        os.symlink(f"/dev/dri/{node}", link)

    def open_file(self, pid: int, fd: int, path: str) -> None:
        """An fd that is not DRM (a log file)."""
        base = self.proc.root / str(pid)
        (base / "fdinfo").mkdir(parents=True, exist_ok=True)
        (base / "fd").mkdir(exist_ok=True)
        (base / "fdinfo" / str(fd)).write_text("pos:\t0\nflags:\t0100001\nmnt_id:\t25\nino:\t7\n")
        os.symlink(path, base / "fd" / str(fd))

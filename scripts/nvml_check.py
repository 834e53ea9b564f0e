#!/usr/bin/env python3
"""Check yard's NVML meter against real CUDA allocations.

    .venv/bin/python scripts/nvml_check.py [--bytes 1GiB] [--gpu 0]

A child process creates a CUDA context on the GPU, then allocates a known
number of bytes (``cudaMalloc`` through ctypes from libcudart, or torch when
that is what is installed); the meter reads it at each step, and after the
child is gone. It prints what the meter saw next to the truth and exits 1 if
the allocation is off by more than 2% or the memory is not seen released.

Without a GPU (no driver, no NVML) it says so and exits 0: there is nothing
to check. Without a CUDA runtime it prints the NVML device figures and exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import os
import subprocess
import sys
import time

from yard.memory import default_meter
from yard.memory.readings import format_bytes


def _cudart() -> ctypes.CDLL | None:
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    found = ctypes.util.find_library("cudart")
    if found:
        names.insert(0, found)
    for pattern in (
        "/usr/local/cuda*/lib64/libcudart.so*",
        f"{sys.prefix}/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*",
    ):
        names += sorted(glob.glob(pattern))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _hold(size: int, gpu: int) -> int:
    """Child: context, then ``size`` bytes; report each step on stdout; hold
    until stdin closes."""
    lib = _cudart()
    if lib is not None:

        def check(rc: int, what: str) -> None:
            if rc != 0:
                sys.exit(f"{what} failed with CUDA error {rc}")

        check(lib.cudaSetDevice(gpu), "cudaSetDevice")
        check(lib.cudaFree(ctypes.c_void_p(0)), "cudaFree(0) (context)")
        print("context", flush=True)
        sys.stdin.readline()
        pointer = ctypes.c_void_p()
        check(lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)), "cudaMalloc")
        check(lib.cudaMemset(pointer, 1, ctypes.c_size_t(size)), "cudaMemset")
        check(lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
    else:
        try:
            import torch  # type: ignore[import-not-found]
        except ImportError:
            print("no-runtime", flush=True)
            return 0
        torch.cuda.set_device(gpu)
        torch.zeros(1, device="cuda")
        print("context", flush=True)
        sys.stdin.readline()
        held = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        assert held.numel() > 0
    print("allocated", flush=True)
    sys.stdin.readline()
    return 0


def _size(text: str) -> int:
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    for unit, factor in units.items():
        if text.upper().endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=_size, default=1 << 30, help="how much to allocate")
    parser.add_argument("--gpu", type=int, default=0, help="NVML/CUDA index of the GPU")
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold:
        return _hold(args.bytes, args.gpu)

    meter = default_meter()
    print(meter.mode_detail)
    if meter.mode != "nvml":
        print("no GPU here: nothing to check")
        return 0
    device = f"gpu{args.gpu}"

    def show(label: str, pids: dict[str, int]) -> tuple[int, int]:
        detail = next(d for d in meter.sample(pids) if d.device == device)
        held = detail.backends["check"].held_bytes if "check" in detail.backends else 0
        print(
            f"{label:>10}: holds {format_bytes(held):>10} ({held} B) by {detail.attribution}; "
            f"device used {format_bytes(detail.used_bytes)} of {format_bytes(detail.total_bytes)} "
            f"(+{format_bytes(detail.reserved_bytes)} reserved by the driver)"
            + (f"; note: {detail.note}" if detail.note else "")
        )
        return held, detail.used_bytes

    _, used_before = show("before", {})
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    child = subprocess.Popen(
        [sys.executable, __file__, "--hold", "--bytes", str(args.bytes), "--gpu", str(args.gpu)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    failures = []
    try:
        step = child.stdout.readline().strip()
        if step == "no-runtime" or not step:
            print("no CUDA runtime (libcudart or torch) to allocate with: NVML figures only")
            return 0
        pids = {"check": child.pid}
        time.sleep(0.5)
        context, used_context = show("context", pids)
        child.stdin.write("\n")
        child.stdin.flush()
        if child.stdout.readline().strip() != "allocated":
            print("the child could not allocate")
            return 1
        time.sleep(0.5)
        allocated, used_allocated = show("allocated", pids)
        grown = allocated - context
        error = (grown - args.bytes) / args.bytes
        print(
            f"per-process growth {format_bytes(grown)} for {format_bytes(args.bytes)} "
            f"allocated: {error:+.2%}; device-used growth "
            f"{format_bytes(used_allocated - used_context)}; CUDA context "
            f"{format_bytes(context)} (device grew {format_bytes(used_context - used_before)})"
        )
        if abs(error) > 0.02:
            failures.append(f"allocation measured {error:+.2%} off")
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    deadline = time.monotonic() + 10
    while True:
        held, used_after = show("after", {"check": child.pid})
        if held == 0 and used_after <= used_before + (64 << 20):
            break
        if time.monotonic() > deadline:
            failures.append("memory not seen released within 10 s")
            break
        time.sleep(0.25)
    meter.close()
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""What yard's test backends send: real PNG and WAV files, embeddings, and
bytes that show any corruption. Deterministic: the same arguments give the
same bytes."""

from __future__ import annotations

import hashlib
import math
import struct
import zlib


def audio_bytes(n: int) -> bytes:
    """``n`` deterministic bytes that look like nothing in particular (every
    byte value occurs), so that any corruption shows."""
    out = bytearray()
    block = b"yard"
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


def png_bytes(width: int, height: int, seed: bytes = b"") -> bytes:
    """A valid RGB PNG of the given size: a gradient tinted by ``seed``."""
    tint = hashlib.sha256(seed).digest()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    # Built a row at a time with slice assignment: a 512x512 image in a few
    # milliseconds, so that generating one never stalls the event loop.
    reds = bytes((x * 255 // max(1, width - 1)) ^ tint[0] for x in range(width))
    blues = bytes([tint[2]]) * width
    rows = bytearray()
    for y in range(height):
        row = bytearray(3 * width)
        row[0::3] = reds
        row[1::3] = bytes([(y * 255 // max(1, height - 1)) ^ tint[1]]) * width
        row[2::3] = blues
        rows.append(0)  # filter: none
        rows += row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(rows)))
        + chunk(b"IEND", b"")
    )


def wav_bytes(seconds: float = 0.25, rate: int = 16000, hz: float = 440.0) -> bytes:
    """A valid mono 16-bit PCM WAV: a sine tone."""
    count = int(seconds * rate)
    samples = b"".join(
        struct.pack("<h", int(12000 * math.sin(2 * math.pi * hz * i / rate))) for i in range(count)
    )
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    body = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


def embedding(text: str, dim: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    raw = [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dim)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]

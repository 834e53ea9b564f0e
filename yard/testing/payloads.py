"""What yard's test backends send: real PNG and WAV files, embeddings, and
bytes that show any corruption. Deterministic: the same arguments give the
same bytes."""

from __future__ import annotations

import base64
import hashlib
import math
import os
import random
import struct
import time
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


_WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one have this "
    "from or had by word but what some we can out other were all there when up use your how said "
    "an each she which do their time if will way about many then them write would like so these "
    "her long make thing see him two has look more day could go come did number sound no most "
    "people my over know water than call first who may down side been now find any new work part"
)


def batch_jsonl(size: int, seed: int = 1) -> bytes:
    """The first ``size`` bytes of a Batch API input file: chat completion
    request lines of 20-120 words each, deterministic for ``seed``, about
    as compressible as real ones (PostgreSQL's pglz keeps 26%, zlib 18%)."""
    rng = random.Random(seed)
    words = _WORDS.split()
    # A pool of prompts drawn in turn: 200 MB in about a second.
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 120))) for _ in range(500)]
    lines: list[bytes] = []
    total = 0
    while total < size:
        line = (
            f'{{"custom_id": "request-{len(lines)}", "method": "POST", "url": '
            '"/v1/chat/completions", "body": {"model": "llama-3.1-8b-instruct", "messages": '
            '[{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", '
            f'"content": "{rng.choice(prompts)}"}}], "max_tokens": {rng.randint(100, 2000)}}}}}\n'
        ).encode()
        lines.append(line)
        total += len(line)
    return b"".join(lines)[:size]


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


def embeddings(model: str, inputs: object, dim: int) -> dict[str, object]:
    """An OpenAI embeddings answer: one :func:`embedding` per input text."""
    texts = inputs if isinstance(inputs, list) else [inputs]
    return {
        "object": "list",
        "model": model,
        "data": [
            {"object": "embedding", "index": i, "embedding": embedding(str(text), dim)}
            for i, text in enumerate(texts)
        ],
        "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)},
    }


def images(body: dict[str, object]) -> dict[str, object]:
    """An OpenAI image generation answer: ``n`` (1 to 4) real PNGs of
    ``size`` (at most 512x512), base64 in JSON."""
    try:
        width, height = (int(v) for v in str(body.get("size", "64x64")).lower().split("x"))
    except ValueError:
        width, height = 64, 64
    width, height = max(1, min(width, 512)), max(1, min(height, 512))
    n = body.get("n")
    count = max(1, min(4, n if isinstance(n, int) and not isinstance(n, bool) else 1))
    prompt = str(body.get("prompt", ""))
    pngs = [png_bytes(width, height, f"{prompt}{i}".encode()) for i in range(count)]
    return {
        "created": int(time.time()),
        "data": [{"b64_json": base64.b64encode(png).decode()} for png in pngs],
    }


def _prompt_text(body: dict[str, object], *, chat: bool) -> str:
    if chat:
        messages = body.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
            return str(messages[-1].get("content", ""))
        return ""
    return str(body.get("prompt", ""))


def completion(model: str, body: dict[str, object], *, chat: bool) -> dict[str, object]:
    """An OpenAI chat or text completion that echoes the prompt."""
    text = f"echo: {_prompt_text(body, chat=chat)}"
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    if chat:
        return {
            "id": f"chatcmpl-{os.getpid()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-{os.getpid()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
        "usage": usage,
    }


def completion_chunk(ident: str, model: str, piece: str | None, *, chat: bool) -> dict[str, object]:
    """One server-sent chunk of a streamed completion: ``piece`` of text, or
    the final chunk (``finish_reason`` stop) when None."""
    if chat:
        delta: dict[str, object] = {} if piece is None else {"content": piece}
        choice: dict[str, object] = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": piece or ""}
    choice["finish_reason"] = None if piece is not None else "stop"
    return {
        "id": ident,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }

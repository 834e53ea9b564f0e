"""What a model needs before it was ever measured: a prior read from its file.

A backend yard has never measured is placed by this estimate until its first
load measures it (``docs/how-yard-decides.md``, "What is loaded: memory
fit"). For a GGUF file (llama.cpp's format) it is worked out from the header
alone, nothing is loaded:

- **weights**: the bytes of every tensor. On a GPU (all layers offloaded,
  llama-server's ``-ngl 99``) llama.cpp keeps the token embedding in host
  memory (its input layer), so that table is counted on the host, the rest on
  the GPU. On the CPU every tensor is read on every token: the mmap'd file's
  pages are held like anonymous memory (:mod:`yard.memory.host`); where the
  CPU backend repacks the weights for its kernels (Intel AMX, seen in
  llama-server's log as an ``AMX model buffer`` as large as the model) they are
  held twice, the copy and the file pages it was read from
  (:func:`cpu_repacks`).
- **KV cache**: ``layers x KV heads x (key width x K-type bytes + value width x
  V-type bytes)`` per token of context, the types from the command's
  ``-ctk``/``-ctv`` (``--cache-type-k``/``--cache-type-v``; ``f16`` by default;
  quantised types by their block size: ``q8_0`` is 34 bytes per 32 values).
  The context is llama.cpp's, padded to 256.
- **compute**: the buffers of one micro-batch (``-ub``, 512 by default). They
  grow with the context: the attention of a micro-batch spans every cell of
  the cache (with flash attention the mask, ``context x ubatch`` halves; without
  it the scores, ``context x ubatch x heads`` floats twice). A fixed part covers
  the activations of the micro-batch (``ubatch x (embedding + feed-forward
  widths)`` floats, and the logits), and the process itself: the runtime and
  its libraries (:data:`HOST_BASE`) and, on a GPU, the CUDA context
  (:data:`GPU_BASE`).

Any other file (safetensors, an ONNX model, a directory's main file) gives its
size as a floor: weights alone, on the device the backend computes on, with no
slope in the context.

The estimate is a line in the context, the shape of a measured profile
(:class:`yard.core.spec.Profile`): the core places a never-measured backend by
it exactly as by a measured one, and the first measurement replaces it.
``bench/prior_fit.py`` compares it with what a real llama-server held.

Entry points: :func:`read_model_file`, :func:`server_settings` (what the
command line changes), :func:`estimate` (bytes at one context) and
:func:`prior` (the core's record), :func:`prior_for` (both from a backend's
command).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from yard.core.spec import BackendSpec, Prior, Profile
from yard.memory.profiles import fill_known

if TYPE_CHECKING:
    from yard.config import Config

__all__ = [
    "CACHE_TYPES",
    "GPU_BASE",
    "HOST_BASE",
    "Estimate",
    "ModelFile",
    "ServerSettings",
    "cpu_repacks",
    "estimate",
    "model_path",
    "prior",
    "prior_for",
    "read_model_file",
    "server_settings",
    "with_priors",
]

log = logging.getLogger(__name__)

MIB = 1 << 20

CACHE_TYPES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
"""Bytes per value of each KV-cache type llama.cpp accepts for ``-ctk``/``-ctv``
(quantised types store blocks of 32 values with their scales)."""

CONTEXT_PAD = 256
"""llama.cpp pads the KV cache to this many cells."""

HOST_BASE = 24 * MIB
"""Host memory of the server process beyond its buffers: code and libraries
(file-backed, held), tokenizer, HTTP server, slot state (a CPU llama-server
with a 60 MB model at 2,048 tokens held 17 MiB beyond its weights, cache and
compute buffer)."""

GPU_BASE = 512 * MIB
"""A CUDA context on the GPU (518 MiB measured on an H200 with NVML); added to
the GPU figure of a backend placed on one."""

GPU_HOST_BASE = 512 * MIB
"""Host memory of a server whose work is on a GPU: the CUDA runtime and its
pinned buffers (0.6 GiB seen for llama-server on the H200)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFile:
    """What a model file says about its memory.

    path, file_bytes: the file and its size.
    gguf: whether it is a GGUF file (else only the size is known).
    architecture: ``general.architecture`` (``"llama"``, ``"qwen2"``, ...).
    tensor_bytes: bytes of all tensors (the file size for other formats).
    input_bytes: bytes of the token embedding (llama.cpp keeps it on the host).
    trained_context: the context it was trained for (``{arch}.context_length``).
    layers: transformer blocks (``{arch}.block_count``).
    kv_heads: KV heads of each layer (``head_count_kv``, a number or per layer).
    heads: attention heads (the largest, where given per layer).
    key_length, value_length: widths of one head's key and value.
    embedding, feed_forward: hidden and feed-forward widths.
    vocabulary: tokens in the vocabulary (the logits' width).
    """

    path: Path
    file_bytes: int
    gguf: bool
    architecture: str | None = None
    tensor_bytes: int = 0
    input_bytes: int = 0
    trained_context: int | None = None
    layers: int = 0
    kv_heads: tuple[int, ...] = ()
    heads: int = 0
    key_length: int = 0
    value_length: int = 0
    embedding: int = 0
    feed_forward: int = 0
    vocabulary: int = 0

    def kv_bytes_per_token(self, cache_k: str = "f16", cache_v: str = "f16") -> float:
        """Bytes one token of context adds to the KV cache, all layers."""
        k, v = CACHE_TYPES[cache_k], CACHE_TYPES[cache_v]
        return sum(heads * (self.key_length * k + self.value_length * v) for heads in self.kv_heads)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    """What llama-server's command line changes in its memory.

    cache_k, cache_v: KV-cache types (``-ctk``/``-ctv``).
    ubatch: micro-batch size (``-ub``/``--ubatch-size``, 512 by default).
    flash_attn: ``-fa`` on or off (None: llama.cpp's ``auto``, which turns it on
        where the device supports it: counted as on).
    mmap: False with ``--no-mmap`` (the weights are read into anonymous memory).
    repack: the CPU backend copies the weights into a buffer of its own
        (:func:`cpu_repacks`); counted for a host-only backend.
    context: ``-c``/``--ctx-size`` where the command fixes it (a number, not
        yard's ``{context}``): the prior's figures are given there.
    """

    cache_k: str = "f16"
    cache_v: str = "f16"
    ubatch: int = 512
    flash_attn: bool | None = None
    mmap: bool = True
    repack: bool = False
    context: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """Bytes a server is expected to hold at one context (no margin).

    gpu_bytes: on each GPU it is placed on (0 for a host-only backend).
    host_bytes: on the host (anonymous memory and held file pages).
    weights, kv, compute: the parts, summed over the devices.
    """

    context: int | None
    gpu_bytes: int
    host_bytes: int
    weights: int
    kv: int
    compute: int


def read_model_file(path: Path) -> ModelFile:
    """What ``path`` says about its memory (blocking: it reads the file's header).

    A GGUF file gives its tensors and architecture; any other file (or a GGUF
    file the ``gguf`` package cannot read) only its size. Raises ``OSError``
    if the file cannot be read.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        return ModelFile(path=path, file_bytes=size, gguf=False, tensor_bytes=size)
    try:
        return _read_gguf(path, size)
    except (ValueError, KeyError, IndexError, TypeError):
        return ModelFile(path=path, file_bytes=size, gguf=False, tensor_bytes=size)


def _read_gguf(path: Path, size: int) -> ModelFile:
    from gguf import GGUFReader  # slow to import: only when a GGUF file is read

    reader = GGUFReader(path)

    def value(key: str) -> object:
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    def number(key: str, default: int = 0) -> int:
        v = value(key)
        if isinstance(v, list):
            return max((int(x) for x in v), default=default)
        return int(v) if isinstance(v, (int, float)) else default

    arch = value("general.architecture")
    a = str(arch) if arch is not None else "llama"
    layers = number(f"{a}.block_count")
    heads = number(f"{a}.attention.head_count")
    raw_kv = value(f"{a}.attention.head_count_kv")
    if isinstance(raw_kv, list):
        kv_heads = tuple(int(x) for x in raw_kv)
    else:
        kv_heads = (int(raw_kv) if isinstance(raw_kv, (int, float)) else heads,) * layers
    embedding = number(f"{a}.embedding_length")
    head_dim = embedding // heads if heads else 0
    trained = number(f"{a}.context_length")
    tensor_bytes = 0
    input_bytes = 0
    vocabulary = number(f"{a}.vocab_size")
    for t in reader.tensors:
        n = int(t.n_bytes)
        tensor_bytes += n
        if t.name == "token_embd.weight":
            input_bytes = n
            if not vocabulary:
                vocabulary = int(t.shape[-1])
    return ModelFile(
        path=path,
        file_bytes=size,
        gguf=True,
        architecture=a,
        tensor_bytes=tensor_bytes,
        input_bytes=input_bytes,
        trained_context=trained or None,
        layers=layers,
        kv_heads=kv_heads,
        heads=heads,
        key_length=number(f"{a}.attention.key_length", head_dim),
        value_length=number(f"{a}.attention.value_length", head_dim),
        embedding=embedding,
        feed_forward=number(f"{a}.feed_forward_length"),
        vocabulary=vocabulary,
    )


_FLAGS = {
    "-ctk": "cache_k",
    "--cache-type-k": "cache_k",
    "-ctv": "cache_v",
    "--cache-type-v": "cache_v",
    "-ub": "ubatch",
    "--ubatch-size": "ubatch",
    "-fa": "flash_attn",
    "--flash-attn": "flash_attn",
    "-c": "context",
    "--ctx-size": "context",
}


def server_settings(argv: Sequence[str]) -> ServerSettings:
    """The memory-relevant settings of a llama-server command line (unknown
    values keep llama.cpp's defaults; ``-ctk`` with a type llama.cpp does not
    know raises ``ValueError`` naming it)."""
    found: dict[str, str] = {}
    mmap = True
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if arg == "--no-mmap":
            mmap = False
        key = _FLAGS.get(name)
        if key is None:
            continue
        if eq:
            found[key] = inline
        elif key == "flash_attn" and (i + 1 >= len(args) or args[i + 1].startswith("-")):
            found[key] = "on"  # older llama.cpp: a bare -fa turns it on
        elif i + 1 < len(args):
            found[key] = args[i + 1]
    for key in ("cache_k", "cache_v"):
        if key in found and found[key] not in CACHE_TYPES:
            known = ", ".join(CACHE_TYPES)
            raise ValueError(f"unknown KV-cache type {found[key]!r}; llama.cpp knows {known}")
    fa = found.get("flash_attn", "auto").lower()
    ubatch = found.get("ubatch", "")
    context = found.get("context", "")
    return ServerSettings(
        context=int(context) if context.isdigit() and int(context) > 0 else None,
        cache_k=found.get("cache_k", "f16"),
        cache_v=found.get("cache_v", "f16"),
        ubatch=int(ubatch) if ubatch.isdigit() and int(ubatch) > 0 else 512,
        flash_attn=None if fa == "auto" else fa in ("on", "1", "true"),
        mmap=mmap,
    )


def cpu_repacks(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether llama.cpp's CPU backend copies a model's weights into a buffer
    of its own on this machine: Intel AMX (``amx_int8`` among the CPU's
    flags), whose buffer takes every matrix it can multiply. False where it
    cannot tell (no ``/proc``)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(
        line.startswith("flags") and "amx_int8" in line.split() for line in text.splitlines()
    )


def _padded(context: int) -> int:
    return -(-context // CONTEXT_PAD) * CONTEXT_PAD


def _compute_per_token(model: ModelFile, settings: ServerSettings) -> float:
    """Compute-buffer bytes each cell of the cache adds (see the module's rules)."""
    if settings.flash_attn is False:
        return settings.ubatch * max(1, model.heads) * 4.0 * 2
    return settings.ubatch * 2.0


def _compute_fixed(model: ModelFile, settings: ServerSettings) -> int:
    """Compute-buffer bytes of one micro-batch that do not depend on the context."""
    width = model.embedding * 4 + model.feed_forward * 3 + model.vocabulary
    return settings.ubatch * width * 4


def estimate(
    model: ModelFile,
    context: int | None,
    *,
    settings: ServerSettings | None = None,
    on_gpu: bool = False,
) -> Estimate:
    """Bytes ``model`` is expected to hold at ``context`` tokens in all (None: the
    trained context, as llama-server takes without ``-c``), on a GPU with every
    layer offloaded (``on_gpu``) or on the CPU."""
    s = settings or ServerSettings()
    if not model.gguf:
        floor = model.file_bytes
        return Estimate(
            context=context,
            gpu_bytes=floor if on_gpu else 0,
            host_bytes=0 if on_gpu else floor,
            weights=floor,
            kv=0,
            compute=0,
        )
    if context is None:
        context = model.trained_context or 4096
    cells = _padded(context)
    kv = math.ceil(model.kv_bytes_per_token(s.cache_k, s.cache_v) * cells)
    compute = _compute_fixed(model, s) + math.ceil(_compute_per_token(model, s) * cells)
    if on_gpu:
        gpu = model.tensor_bytes - model.input_bytes + kv + compute + GPU_BASE
        host = model.input_bytes + GPU_HOST_BASE
    else:
        gpu = 0
        copies = 2 if s.repack else 1
        host = model.tensor_bytes * copies + kv + compute + HOST_BASE
    return Estimate(
        context=context,
        gpu_bytes=gpu,
        host_bytes=host,
        weights=model.tensor_bytes,
        kv=kv,
        compute=compute,
    )


def prior(
    model: ModelFile,
    *,
    settings: ServerSettings | None = None,
    on_gpu: bool = False,
    unified: bool = False,
) -> Prior:
    """The core's record of ``model``'s estimate: the figures at the context
    the command fixes, else the trained one (else 4,096 tokens), as a line in
    the context, the trained context,
    and the sentence reasons quote. ``unified``: the GPU's memory is the
    host's (Apple silicon: its meter shows a backend's whole footprint on
    both), so a GPU backend's host figure is its GPU figure."""
    s = settings or ServerSettings()
    if not model.gguf:
        at = estimate(model, None, settings=s, on_gpu=on_gpu)
        host = at.gpu_bytes if unified and on_gpu else at.host_bytes
        figures = Profile(gpu_bytes=at.gpu_bytes, host_bytes=host, load_s=0.0)
        return Prior(profile=figures, trained_context=None, source="the model file's size")
    anchor = s.context or model.trained_context or 4096
    here = estimate(model, anchor, settings=s, on_gpu=on_gpu)
    per_token = model.kv_bytes_per_token(s.cache_k, s.cache_v) + _compute_per_token(model, s)
    shared = unified and on_gpu
    figures = Profile(
        gpu_bytes=here.gpu_bytes,
        host_bytes=here.gpu_bytes if shared else here.host_bytes,
        load_s=0.0,
        context=_padded(anchor),
        gpu_per_token=per_token if on_gpu else 0.0,
        host_per_token=per_token if shared or not on_gpu else 0.0,
    )
    return Prior(profile=figures, trained_context=model.trained_context, source="the model file")


def model_path(argv: Sequence[str], model_file: Path | None, cwd: Path | None) -> Path | None:
    """The model file a backend loads: its ``model_file``, else the argument of
    ``-m``/``--model`` in its command (None: neither names an existing file)."""
    candidates: list[str] = [str(model_file)] if model_file is not None else []
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in ("-m", "--model"):
            if eq:
                candidates.append(inline)
            elif i + 1 < len(args):
                candidates.append(args[i + 1])
    for candidate in candidates:
        path = Path(os.path.expanduser(candidate))
        if not path.is_absolute() and cwd is not None:
            path = cwd / path
        if path.is_file():
            return path
    return None


def prior_for(
    argv: Sequence[str],
    model_file: Path | None,
    cwd: Path | None,
    *,
    on_gpu: bool,
    unified: bool | None = None,
) -> Prior | None:
    """The prior of a backend from its command line and ``model_file`` (None: no
    model file is found; blocking: it reads the file's header). ``unified``:
    see :func:`prior` (None: on macOS, where yard meters Apple silicon's
    unified memory). Raises ``ValueError`` for a cache type llama.cpp does not
    know."""
    path = model_path(argv, model_file, cwd)
    if path is None:
        return None
    try:
        model = read_model_file(path)
    except OSError:
        return None
    settings = server_settings(argv)
    if not on_gpu:
        settings = dataclasses.replace(settings, repack=cpu_repacks())
    if unified is None:
        unified = sys.platform == "darwin"
    return prior(model, settings=settings, on_gpu=on_gpu, unified=unified)


def with_priors(config: Config, specs: Sequence[BackendSpec]) -> list[BackendSpec]:
    """``specs`` with the prior of each backend whose model file is found
    (blocking: it reads each file's header; a file that cannot be read leaves
    that backend without a prior, said once in the log)."""
    values = {
        "config_dir": str(config.path.parent),
        "data_dir": str(config.server.data_dir),
        "python": sys.executable,
    }
    out: list[BackendSpec] = []
    for spec in specs:
        b = config.backends.get(spec.name)
        if b is None:
            out.append(spec)
            continue
        here = dict(values, model_file=str(b.model_file or ""))
        argv = [fill_known(arg, here) for arg in b.command]
        try:
            found = prior_for(argv, b.model_file, b.cwd, on_gpu=bool(spec.gpus))
        except ValueError as exc:
            log.warning("%s: no estimate from its model file: %s", spec.name, exc)
            found = None
        if found is not None:
            p = found.profile
            log.info(
                "%s: until measured, estimated from %s: %.1f GiB GPU / %.1f GiB host at %s tokens",
                spec.name,
                found.source,
                p.gpu_bytes / 2**30,
                p.host_bytes / 2**30,
                f"{p.context:,}" if p.context is not None else "any",
            )
        out.append(dataclasses.replace(spec, prior=found))
    return out

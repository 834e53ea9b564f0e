"""A tiny llama model, written locally: random weights in a valid GGUF file.

llama.cpp's ``llama-server`` loads it like any other llama model and answers
chat and text completions with it (the text is gibberish: the weights are
random). Nothing is downloaded, and a 5 MB file takes a fraction of a second,
so the demo and the tests make their own models.

The file has:

- the llama architecture (RMS norm, rotary embeddings, SwiGLU feed-forward,
  grouped-query attention when ``n_kv_head < n_head``), F16 or F32 weights;
- a SentencePiece-style vocabulary (``tokenizer.ggml.model = "llama"``) with
  byte fallback: the 256 byte tokens ``<0x00>``..``<0xFF>`` mean any text can
  be tokenized, plus ``<unk>``, ``<s>``, ``</s>`` and the ChatML markers;
- a ChatML chat template, so ``/v1/chat/completions`` works.

The vocabulary and the template are in :mod:`yard.demo.vocabulary`.

Command line::

    python -m yard.demo.tinymodel OUT.gguf --size-mb 5 --layers 4
    python -m yard.demo.tinymodel OUT.gguf --n-embd 256 --layers 2 --json

From Python, :func:`write_tiny_llama` writes a model with exact dimensions
and :func:`write_sized_llama` one of about a given size; both return
:class:`ModelFacts`, which has what KV-cache arithmetic needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np

from yard.demo.vocabulary import (
    BOS_ID,
    CHAT_TEMPLATE,
    EOS_ID,
    IM_END_ID,
    MIN_VOCAB,
    UNK_ID,
    vocabulary,
)

__all__ = [
    "CHAT_TEMPLATE",
    "Dimensions",
    "ModelFacts",
    "main",
    "size_for",
    "sized_dimensions",
    "write_sized_llama",
    "write_tiny_llama",
]


WeightType = Literal["f16", "f32"]


class Dimensions(TypedDict):
    """The shape of a model, as :func:`write_tiny_llama` takes it."""

    n_layers: int
    n_embd: int
    n_head: int
    n_kv_head: int
    n_ff: int
    vocab_size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFacts:
    """What was written, with what memory arithmetic needs.

    head_dim: ``n_embd // n_head``; K and V rows are ``n_kv_head * head_dim``
        wide. weight_type: ``"f16"`` or ``"f32"`` (norms are always F32).
    file_bytes: size of the GGUF file. n_params: parameters in all tensors.
    context_length: the training context the file declares
        (``llama.context_length``); ``llama-server`` uses it when no ``-c`` is
        given, so always pass ``-c``.
    """

    path: Path
    n_layers: int
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_ff: int
    vocab_size: int
    context_length: int
    weight_type: WeightType
    n_params: int
    file_bytes: int

    def kv_cache_bytes(self, n_ctx: int, *, bytes_per_element: int = 2) -> int:
        """Bytes of the K and V caches for ``n_ctx`` cells in total (summed
        over all of llama-server's slots), all layers; ``bytes_per_element``:
        2 for llama.cpp's default F16 cache, 1 for q8_0-ish estimates."""
        return 2 * self.n_layers * n_ctx * self.n_kv_head * self.head_dim * bytes_per_element

    def to_json(self) -> dict[str, object]:
        """The facts as JSON-ready values (the path as a string)."""
        facts = dataclasses.asdict(self)
        facts["path"] = str(self.path)
        return facts


_POOL = 1_000_003
"""Size of the pool of random weights (a prime)."""


def _draw(pool: np.ndarray, count: int, offset: int) -> np.ndarray:
    """``count`` values of ``pool`` from ``offset`` on, wrapping around."""
    reps = -(-(offset + count) // len(pool))
    return (
        np.tile(pool, reps)[offset : offset + count] if reps > 1 else pool[offset : offset + count]
    )


def _tensor_shapes(
    *, n_layers: int, n_embd: int, n_head: int, n_kv_head: int, n_ff: int, vocab_size: int
) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, numpy shape, is_norm) for every tensor, in file order.

    numpy shapes are (rows, columns) = (out, in); GGUF stores them reversed,
    which is what llama.cpp expects of a matrix written from numpy.
    """
    head_dim = n_embd // n_head
    kv_dim = n_kv_head * head_dim
    shapes: list[tuple[str, tuple[int, ...], bool]] = [
        ("token_embd.weight", (vocab_size, n_embd), False),
    ]
    for i in range(n_layers):
        blk = f"blk.{i}."
        shapes += [
            (blk + "attn_norm.weight", (n_embd,), True),
            (blk + "attn_q.weight", (n_head * head_dim, n_embd), False),
            (blk + "attn_k.weight", (kv_dim, n_embd), False),
            (blk + "attn_v.weight", (kv_dim, n_embd), False),
            (blk + "attn_output.weight", (n_embd, n_head * head_dim), False),
            (blk + "ffn_norm.weight", (n_embd,), True),
            (blk + "ffn_gate.weight", (n_ff, n_embd), False),
            (blk + "ffn_up.weight", (n_ff, n_embd), False),
            (blk + "ffn_down.weight", (n_embd, n_ff), False),
        ]
    shapes += [
        ("output_norm.weight", (n_embd,), True),
        ("output.weight", (vocab_size, n_embd), False),
    ]
    return shapes


def _check_dimensions(
    *, n_layers: int, n_embd: int, n_head: int, n_kv_head: int, n_ff: int, vocab_size: int
) -> None:
    problems = []
    if n_layers < 1:
        problems.append(f"n_layers must be at least 1, got {n_layers}")
    if n_head < 1 or n_embd % n_head:
        problems.append(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
    elif (n_embd // n_head) % 2:
        problems.append(
            f"head_dim n_embd/n_head must be even for rotary embeddings, got {n_embd // n_head}"
        )
    if n_kv_head < 1 or n_head % n_kv_head:
        problems.append(f"n_head ({n_head}) must be a multiple of n_kv_head ({n_kv_head})")
    if n_ff < 1:
        problems.append(f"n_ff must be at least 1, got {n_ff}")
    if vocab_size < MIN_VOCAB:
        problems.append(
            f"vocab_size must be at least {MIN_VOCAB} (specials + 256 bytes), got {vocab_size}"
        )
    if problems:
        raise ValueError("; ".join(problems))


def size_for(
    *,
    n_layers: int,
    n_embd: int,
    n_head: int,
    n_kv_head: int,
    n_ff: int,
    vocab_size: int,
    weight_type: WeightType = "f16",
) -> int:
    """Bytes of tensor data a model of these dimensions has (the file adds a
    few kilobytes of header and vocabulary)."""
    width = 2 if weight_type == "f16" else 4
    total = 0
    for _, shape, is_norm in _tensor_shapes(
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_kv_head=n_kv_head,
        n_ff=n_ff,
        vocab_size=vocab_size,
    ):
        total += int(np.prod(shape)) * (4 if is_norm else width)
    return total


def write_tiny_llama(
    path: Path,
    *,
    n_layers: int,
    n_embd: int,
    n_head: int,
    n_kv_head: int,
    n_ff: int,
    vocab_size: int,
    context_length: int = 2048,
    weight_type: WeightType = "f16",
    seed: int = 0,
    name: str = "yard-tiny-llama",
) -> ModelFacts:
    """Write a llama GGUF with random weights to ``path`` (replaced if present)
    and return its facts.

    Same arguments and seed give the same bytes. Tensors are generated and
    written one at a time, so memory stays near the size of the largest one
    even for files of hundreds of megabytes. Raises ValueError for dimensions
    llama.cpp would refuse (head_dim odd, n_head not a multiple of n_kv_head,
    a vocabulary too small for the byte fallback).
    """
    import gguf  # deferred: only model writers need it

    _check_dimensions(
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_kv_head=n_kv_head,
        n_ff=n_ff,
        vocab_size=vocab_size,
    )
    head_dim = n_embd // n_head
    dtype = np.float16 if weight_type == "f16" else np.float32
    shapes = _tensor_shapes(
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_kv_head=n_kv_head,
        n_ff=n_ff,
        vocab_size=vocab_size,
    )
    tokens, scores, types = vocabulary(vocab_size)

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(partial, "llama")
    writer.add_name(name)
    writer.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if weight_type == "f16" else gguf.LlamaFileType.ALL_F32
    )
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv_head)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_eot_token_id(IM_END_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    n_params = 0
    for tensor_name, shape, is_norm in shapes:
        count = int(np.prod(shape))
        n_params += count
        tensor_dtype = np.dtype(np.float32) if is_norm else np.dtype(dtype)
        writer.add_tensor_info(tensor_name, shape, tensor_dtype, count * tensor_dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    # Drawing every weight afresh makes a 500 MB model CPU-bound for seconds;
    # windows at random offsets into one pool of normal draws are random
    # enough for a model nobody trains. The pool's size is prime, so rows of
    # power-of-two width do not repeat. Small weights (σ = 0.02) keep
    # activations finite through every layer.
    pool = (rng.standard_normal(_POOL, dtype=np.float32) * 0.02).astype(dtype)
    for _, shape, is_norm in shapes:
        if is_norm:
            data = np.ones(shape, dtype=np.float32)
        else:
            data = _draw(pool, int(np.prod(shape)), int(rng.integers(_POOL))).reshape(shape)
        writer.write_tensor_data(data)
    writer.close()
    partial.replace(path)

    return ModelFacts(
        path=path,
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_kv_head=n_kv_head,
        head_dim=head_dim,
        n_ff=n_ff,
        vocab_size=vocab_size,
        context_length=context_length,
        weight_type=weight_type,
        n_params=n_params,
        file_bytes=path.stat().st_size,
    )


def _ff_for(n_embd: int) -> int:
    """llama's feed-forward width: about 8/3 of the embedding, a multiple of 32."""
    return max(32, (8 * n_embd // 3 + 31) // 32 * 32)


def sized_dimensions(
    size_bytes: int,
    *,
    n_layers: int,
    vocab_size: int = 1024,
    head_dim: int = 64,
    gqa: int = 1,
    weight_type: WeightType = "f16",
) -> Dimensions:
    """Dimensions of the widest model of ``n_layers`` layers whose tensors
    take at most ``size_bytes`` (the narrowest possible, ``head_dim × gqa``
    wide, if even that is larger); its feed-forward is widened to fill what
    the width steps leave. ``gqa``: query heads per KV head."""
    step = head_dim * gqa
    best: Dimensions | None = None
    n_embd = step
    while True:
        n_head = n_embd // head_dim
        dims = Dimensions(
            n_layers=n_layers,
            n_embd=n_embd,
            n_head=n_head,
            n_kv_head=n_head // gqa,
            n_ff=_ff_for(n_embd),
            vocab_size=vocab_size,
        )
        if size_for(**dims, weight_type=weight_type) > size_bytes:
            break
        best = dims
        n_embd += step
    if best is None:
        return dims
    # Widen the feed-forward into what is left: width steps are coarse.
    while True:
        wider = Dimensions(**{**best, "n_ff": best["n_ff"] + 32})
        if size_for(**wider, weight_type=weight_type) > size_bytes:
            return best
        best = wider


def write_sized_llama(
    path: Path,
    *,
    size_mb: float,
    n_layers: int = 4,
    vocab_size: int = 1024,
    head_dim: int = 64,
    gqa: int = 1,
    context_length: int = 2048,
    weight_type: WeightType = "f16",
    seed: int = 0,
) -> ModelFacts:
    """Write a model of about ``size_mb`` megabytes (10⁶ bytes; never more,
    unless even the narrowest model is larger) with :func:`write_tiny_llama`."""
    dims = sized_dimensions(
        int(size_mb * 1e6),
        n_layers=n_layers,
        vocab_size=vocab_size,
        head_dim=head_dim,
        gqa=gqa,
        weight_type=weight_type,
    )
    return write_tiny_llama(
        path, **dims, context_length=context_length, weight_type=weight_type, seed=seed
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m yard.demo.tinymodel",
        description="Write a tiny llama GGUF with random weights (nothing is downloaded).",
    )
    p.add_argument("out", type=Path, help="the .gguf file to write")
    p.add_argument("--size-mb", type=float, help="about this many megabytes (picks the width)")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    p.add_argument("--n-embd", type=int, help="embedding width (instead of --size-mb)")
    p.add_argument("--n-head", type=int, help="attention heads (default n_embd/head-dim)")
    p.add_argument("--n-kv-head", type=int, help="KV heads (default n_head/gqa)")
    p.add_argument("--n-ff", type=int, help="feed-forward width (default about 8/3 n_embd)")
    p.add_argument("--head-dim", type=int, default=64, help="width of a head (default 64)")
    p.add_argument("--gqa", type=int, default=1, help="query heads per KV head (default 1)")
    p.add_argument("--vocab", type=int, default=1024, help="vocabulary size (default 1024)")
    p.add_argument("--ctx", type=int, default=2048, help="declared context length (default 2048)")
    p.add_argument("--dtype", choices=["f16", "f32"], default="f16", help="weight type")
    p.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    p.add_argument("--json", action="store_true", help="print the model's facts as JSON")
    p.add_argument(
        "--if-missing", action="store_true", help="do nothing if OUT exists (for Makefiles)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.if_missing and out.exists():
        print(f"{out} exists; left as it is")
        return 0
    weight_type: WeightType = args.dtype
    try:
        if args.n_embd is not None:
            n_head = args.n_head or max(1, args.n_embd // args.head_dim)
            facts = write_tiny_llama(
                out,
                n_layers=args.layers,
                n_embd=args.n_embd,
                n_head=n_head,
                n_kv_head=args.n_kv_head or max(1, n_head // args.gqa),
                n_ff=args.n_ff or _ff_for(args.n_embd),
                vocab_size=args.vocab,
                context_length=args.ctx,
                weight_type=weight_type,
                seed=args.seed,
            )
        elif args.size_mb is not None:
            facts = write_sized_llama(
                out,
                size_mb=args.size_mb,
                n_layers=args.layers,
                vocab_size=args.vocab,
                head_dim=args.head_dim,
                gqa=args.gqa,
                context_length=args.ctx,
                weight_type=weight_type,
                seed=args.seed,
            )
        else:
            parser.error("give --size-mb N or --n-embd N")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(facts.to_json(), indent=2))
    else:
        print(
            f"wrote {out}: {facts.file_bytes / 1e6:.1f} MB, {facts.n_params:,} parameters, "
            f"{facts.n_layers} layers × {facts.n_embd} wide, {facts.n_head} heads "
            f"({facts.n_kv_head} KV), vocabulary {facts.vocab_size}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

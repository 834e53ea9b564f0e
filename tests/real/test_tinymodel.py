"""The tiny GGUF writer: what it writes is what it says it wrote.

(Fast: no server. The slow tests beside this one load these files in the real
llama-server.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from yard.demo.tinymodel import (
    CHAT_TEMPLATE,
    main,
    size_for,
    write_sized_llama,
    write_tiny_llama,
)

DIMS: dict[str, Any] = {
    "n_layers": 2,
    "n_embd": 128,
    "n_head": 4,
    "n_kv_head": 2,
    "n_ff": 352,
    "vocab_size": 400,
}


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def test_header_declares_the_dimensions_the_facts_report(tmp_path: Path) -> None:
    facts = write_tiny_llama(tmp_path / "m.gguf", **DIMS, context_length=512)
    reader = gguf.GGUFReader(facts.path)
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "llama.block_count") == facts.n_layers == 2
    assert _field(reader, "llama.embedding_length") == facts.n_embd == 128
    assert _field(reader, "llama.attention.head_count") == facts.n_head == 4
    assert _field(reader, "llama.attention.head_count_kv") == facts.n_kv_head == 2
    assert _field(reader, "llama.feed_forward_length") == facts.n_ff == 352
    assert _field(reader, "llama.context_length") == facts.context_length == 512
    assert _field(reader, "llama.rope.dimension_count") == facts.head_dim == 32
    assert _field(reader, "tokenizer.chat_template") == CHAT_TEMPLATE
    assert facts.file_bytes == (tmp_path / "m.gguf").stat().st_size


def test_tensors_have_llama_shapes_and_count_as_reported(tmp_path: Path) -> None:
    facts = write_tiny_llama(tmp_path / "m.gguf", **DIMS)
    tensors = {t.name: t for t in gguf.GGUFReader(facts.path).tensors}
    assert len(tensors) == 2 + 9 * 2 + 1
    # GGUF lists dimensions innermost first: (in, out).
    assert tensors["blk.1.attn_k.weight"].shape.tolist() == [128, 2 * 32]
    assert tensors["blk.0.ffn_down.weight"].shape.tolist() == [352, 128]
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert sum(int(t.n_elements) for t in tensors.values()) == facts.n_params
    weights = np.asarray(tensors["blk.0.attn_q.weight"].data, dtype=np.float32)
    assert np.isfinite(weights).all()
    assert 0.01 < float(weights.std()) < 0.03


def test_vocabulary_has_byte_fallback_and_chatml_markers(tmp_path: Path) -> None:
    facts = write_tiny_llama(tmp_path / "m.gguf", **DIMS)
    reader = gguf.GGUFReader(facts.path)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == 400
    assert len(set(tokens)) == 400
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    byte_tokens = [t for t, kind in zip(tokens, types, strict=True) if kind == 6]
    assert byte_tokens == [f"<0x{b:02X}>" for b in range(256)]
    assert tokens[_field(reader, "tokenizer.ggml.eos_token_id")] == "</s>"
    assert tokens[_field(reader, "tokenizer.ggml.bos_token_id")] == "<s>"
    assert {"<|im_start|>", "<|im_end|>"} <= set(tokens)


def test_same_seed_writes_the_same_bytes_and_another_seed_does_not(tmp_path: Path) -> None:
    a = write_tiny_llama(tmp_path / "a.gguf", **DIMS, seed=7)
    b = write_tiny_llama(tmp_path / "b.gguf", **DIMS, seed=7)
    c = write_tiny_llama(tmp_path / "c.gguf", **DIMS, seed=8)
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.path.read_bytes() != c.path.read_bytes()


def test_kv_cache_arithmetic_counts_k_and_v_for_every_layer(tmp_path: Path) -> None:
    facts = write_tiny_llama(tmp_path / "m.gguf", **DIMS)
    # 2 (K and V) × 2 layers × 1000 cells × 2 KV heads × 32 wide × 2 bytes (F16)
    assert facts.kv_cache_bytes(1000) == 2 * 2 * 1000 * 2 * 32 * 2 == 512_000
    assert facts.kv_cache_bytes(1000, bytes_per_element=4) == 1_024_000


@pytest.mark.parametrize("size_mb", [1.0, 5.0])
def test_sized_model_is_near_the_requested_size_and_never_above(
    tmp_path: Path, size_mb: float
) -> None:
    facts = write_sized_llama(tmp_path / "m.gguf", size_mb=size_mb, n_layers=2)
    tensor_bytes = size_for(
        n_layers=facts.n_layers,
        n_embd=facts.n_embd,
        n_head=facts.n_head,
        n_kv_head=facts.n_kv_head,
        n_ff=facts.n_ff,
        vocab_size=facts.vocab_size,
    )
    assert tensor_bytes <= size_mb * 1e6
    assert facts.file_bytes > 0.6 * size_mb * 1e6
    assert facts.file_bytes - tensor_bytes < 100_000  # header, vocabulary, padding


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_head": 3}, "multiple of n_head"),
        ({"n_kv_head": 3}, "multiple of n_kv_head"),
        ({"vocab_size": 100}, "vocab_size must be at least"),
        ({"n_embd": 96, "n_head": 32}, "must be even"),
    ],
)
def test_dimensions_llama_cpp_would_refuse_are_refused_before_writing(
    tmp_path: Path, change: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        write_tiny_llama(tmp_path / "m.gguf", **{**DIMS, **change})
    assert not (tmp_path / "m.gguf").exists()


def test_command_line_writes_once_with_if_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "models" / "m.gguf"
    assert main([str(out), "--size-mb", "1", "--layers", "2"]) == 0
    first = out.read_bytes()
    assert main([str(out), "--size-mb", "1", "--layers", "2", "--seed", "9", "--if-missing"]) == 0
    assert out.read_bytes() == first
    assert "exists" in capsys.readouterr().out

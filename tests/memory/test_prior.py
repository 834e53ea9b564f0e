"""The prior read from a model file: what a never-measured backend is placed by."""

from __future__ import annotations

from pathlib import Path

import pytest

from yard.config import load_config
from yard.demo.tinymodel import write_tiny_llama
from yard.memory.prior import (
    CONTEXT_PAD,
    GPU_BASE,
    GPU_HOST_BASE,
    estimate,
    model_path,
    prior,
    read_model_file,
    server_settings,
    with_priors,
)

MIB = 1 << 20


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "m.gguf"
    write_tiny_llama(
        path,
        n_layers=3,
        n_embd=256,
        n_head=4,
        n_kv_head=2,
        n_ff=512,
        vocab_size=1024,
        context_length=8192,
    )
    return path


def test_the_header_gives_layers_kv_heads_widths_and_the_trained_context(gguf: Path) -> None:
    m = read_model_file(gguf)
    assert m.gguf and m.architecture == "llama"
    assert (m.layers, m.kv_heads, m.heads) == (3, (2, 2, 2), 4)
    assert (m.key_length, m.value_length) == (64, 64)
    assert m.trained_context == 8192
    assert 0 < m.input_bytes < m.tensor_bytes < m.file_bytes


def test_kv_bytes_per_token_follow_the_cache_types(gguf: Path) -> None:
    m = read_model_file(gguf)
    # 3 layers x 2 KV heads x (64 + 64) values
    assert m.kv_bytes_per_token() == 3 * 2 * 128 * 2
    assert m.kv_bytes_per_token("q8_0", "q8_0") == 3 * 2 * 128 * 34 / 32
    assert m.kv_bytes_per_token("f16", "q4_0") == 3 * 2 * (64 * 2 + 64 * 18 / 32)


def test_the_command_line_sets_cache_types_micro_batch_and_mmap() -> None:
    s = server_settings(["-m", "x.gguf", "-ctk", "q8_0", "--cache-type-v=q4_0", "-ub", "256"])
    assert (s.cache_k, s.cache_v, s.ubatch, s.mmap) == ("q8_0", "q4_0", 256, True)
    assert server_settings(["--no-mmap", "-fa", "off"]).flash_attn is False
    assert server_settings([]).flash_attn is None
    with pytest.raises(ValueError, match="unknown KV-cache type 'q3'"):
        server_settings(["-ctk", "q3"])


def test_the_estimate_grows_by_the_kv_cache_and_the_compute_per_token(gguf: Path) -> None:
    m = read_model_file(gguf)
    a = estimate(m, 4096)
    b = estimate(m, 8192)
    per_token = (b.host_bytes - a.host_bytes) / 4096
    assert per_token == m.kv_bytes_per_token() + 512 * 2  # flash attention's mask
    assert a.kv == 4096 * m.kv_bytes_per_token()
    assert a.gpu_bytes == 0 and a.host_bytes > m.tensor_bytes
    # padded like llama.cpp's cache
    assert estimate(m, 4097).kv == (4096 + CONTEXT_PAD) * m.kv_bytes_per_token()


def test_on_a_gpu_the_token_embedding_stays_on_the_host(gguf: Path) -> None:
    m = read_model_file(gguf)
    e = estimate(m, 4096, on_gpu=True)
    assert e.gpu_bytes == m.tensor_bytes - m.input_bytes + e.kv + e.compute + GPU_BASE
    assert e.host_bytes == m.input_bytes + GPU_HOST_BASE


def test_the_prior_is_a_line_through_the_trained_context(gguf: Path) -> None:
    m = read_model_file(gguf)
    p = prior(m)
    assert p.trained_context == 8192 and p.source == "the model file"
    assert p.profile.context == 8192
    assert p.profile.host_bytes == estimate(m, 8192).host_bytes
    at_2k = p.profile.host_bytes - (p.profile.host_per_token or 0) * 6144
    assert at_2k == pytest.approx(estimate(m, 2048).host_bytes, abs=1)


def test_any_other_file_gives_its_size_as_a_floor(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\0" * 4096)
    m = read_model_file(f)
    assert not m.gguf and m.tensor_bytes == 4096
    p = prior(m, on_gpu=True)
    assert p.profile.gpu_bytes == 4096 and p.profile.context is None
    assert p.source == "the model file's size"


def test_the_model_file_is_found_in_the_command(tmp_path: Path, gguf: Path) -> None:
    assert model_path(["llama-server", "-m", str(gguf)], None, None) == gguf
    assert model_path(["llama-server", f"--model={gguf}"], None, None) == gguf
    assert model_path(["llama-server", "-m", gguf.name], None, gguf.parent) == gguf
    assert model_path(["llama-server", "-m", "missing.gguf"], None, tmp_path) is None


def test_serve_attaches_the_prior_of_each_backend_it_finds(tmp_path: Path, gguf: Path) -> None:
    config = tmp_path / "yard.toml"
    config.write_text(
        f"""
[backends.llm]
models = ["m"]
command = ["llama-server", "--port", "{{port}}", "-m", "{{model_file}}", "-c", "{{context}}"]
model_file = "{gguf}"
context = {{ min = 1024, max = 16384 }}

[backends.other]
models = ["o"]
command = ["some-server", "--port", "{{port}}"]
"""
    )
    loaded = load_config(config)
    specs = {s.name: s for s in with_priors(loaded, loaded.backend_specs())}
    llm = specs["llm"].prior
    assert llm is not None and llm.trained_context == 8192
    assert specs["other"].prior is None


def test_a_context_the_command_fixes_anchors_the_prior(gguf: Path) -> None:
    """A backend with no range starts at its own -c: that is where it is judged."""
    m = read_model_file(gguf)
    fixed = prior(m, settings=server_settings(["-c", "2048"]))
    assert fixed.profile.context == 2048
    assert fixed.profile.host_bytes == estimate(m, 2048).host_bytes
    assert server_settings(["-c", "{context}"]).context is None

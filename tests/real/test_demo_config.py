"""config/demo.toml, the file `make serve` runs, is valid and fits what
`make demo-setup` lays down."""

from __future__ import annotations

import re
from pathlib import Path

from yard.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "demo.toml"


def test_demo_config_loads_with_three_backends_on_loopback() -> None:
    config = load_config(DEMO, env={})
    assert set(config.backends) == {"llm", "tts", "images"}
    assert config.backend_for_model("tiny-llama") is config.backends["llm"]
    assert config.backend_for_model("tiny-image") is config.backends["images"]
    assert config.backend_for_model("tts-joe") is config.backends["tts"]
    assert config.server.listen_host == "127.0.0.1"
    assert config.server.data_dir == ROOT / ".data"


def test_demo_model_file_is_the_one_the_makefile_writes() -> None:
    config = load_config(DEMO, env={})
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^DEMO_MODEL\s*:=\s*(\S+)", makefile, re.MULTILINE)
    assert match is not None
    assert config.backends["llm"].model_file == ROOT / match.group(1)


def test_demo_backends_run_llama_server_wherever_it_is_and_launchers_of_this_package() -> None:
    config = load_config(DEMO, env={})
    assert config.backends["llm"].command[0] == "{llama_server}"
    modules = {b.name: b.command[2] for b in config.backends.values() if b.name != "llm"}
    assert modules == {"tts": "yard.demo.tts", "images": "yard.testing.backend"}
    for module in modules.values():
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file()

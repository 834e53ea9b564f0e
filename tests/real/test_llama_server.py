"""The tiny GGUF in the real llama-server, driven by the official openai client
directly (no yard in between): the ground the yard tests stand on."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio

from tests.real.clients import assert_full_round, chat_and_completions
from tests.real.servers import free_port, llama_server_argv, llama_server_or_skip, running_server
from yard.demo.tinymodel import write_sized_llama

pytestmark = pytest.mark.slow


async def test_tiny_model_answers_chat_and_text_completions_streaming_and_not(
    tmp_path: Path,
) -> None:
    command = llama_server_or_skip()
    model = write_sized_llama(tmp_path / "tiny.gguf", size_mb=5)
    port = free_port()
    argv = llama_server_argv(command, model.path, port, alias="tiny-llama")
    with trio.fail_after(120):
        async with running_server(argv, port=port, log=tmp_path / "llama.log") as server:
            answers = await trio.to_thread.run_sync(
                partial(chat_and_completions, server.base_url, model="tiny-llama")
            )
    assert_full_round(answers)
    assert answers.models == ["tiny-llama"]

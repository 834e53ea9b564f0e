"""[backends.NAME] context = { min, max }: the range a start's {context} is chosen from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.test_config import errors_of, load

LLM = """
[backends.llm]
models = ["m"]
command = ["llama-server", "--port", "{{port}}", {arg}]
{context}
"""


def test_a_range_reaches_the_core_and_the_command_uses_it(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        LLM.format(arg='"-c", "{context}"', context="context = { min = 4096, max = 32768 }"),
    )
    assert config.backends["llm"].context == (4096, 32768)
    [spec] = config.backend_specs()
    assert spec.context == (4096, 32768)


@pytest.mark.parametrize(
    ("arg", "context", "error"),
    [
        ('"-c", "{context}"', "", "backends.llm.command: uses {context} but the backend has no"),
        ('"-c", "2048"', "context = { min = 1, max = 2 }", "never uses {context}"),
        ('"-c", "{context}"', "context = { min = 8192, max = 4096 }", "needs 1 <= min <= max"),
        ('"-c", "{context}"', "context = { min = 4096 }", "must be a table { min = N, max = M }"),
        ('"-c", "{context}"', 'context = { min = "4k", max = 8192 }', "whole token counts"),
    ],
)
def test_a_bad_range_is_an_error_naming_the_key(
    tmp_path: Path, arg: str, context: str, error: str
) -> None:
    errors = errors_of(tmp_path, LLM.format(arg=arg, context=context))
    assert any(error in e for e in errors), errors

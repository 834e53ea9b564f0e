"""[backends.NAME] parallel = { min, max }: the range a start's {parallel} is chosen from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.test_config import errors_of, load

LLM = """
[backends.llm]
models = ["m"]
command = ["llama-server", "--port", "{{port}}", {arg}]
{extra}
"""

PER_SLOT = '"-c", "{total_context}", "-np", "{parallel}"'
RANGES = "context = { min = 4096, max = 16384 }\nparallel = { min = 1, max = 8 }"


def test_a_range_reaches_the_core_and_sets_the_slots_estimate(tmp_path: Path) -> None:
    config = load(tmp_path, LLM.format(arg=PER_SLOT, extra=RANGES))
    backend = config.backends["llm"]
    assert (backend.parallel, backend.slots) == ((1, 8), 1)
    [spec] = config.backend_specs()
    assert (spec.context, spec.parallel, spec.slots) == ((4096, 16384), (1, 8), 1)


def test_slots_alone_without_a_context(tmp_path: Path) -> None:
    config = load(tmp_path, LLM.format(arg='"-np", "{parallel}"', extra=RANGES.split("\n")[1]))
    [spec] = config.backend_specs()
    assert (spec.context, spec.parallel, spec.slots) == (None, (1, 8), 1)


@pytest.mark.parametrize(
    ("arg", "extra", "error"),
    [
        ('"-np", "{parallel}"', "", "backends.llm.command: uses {parallel} but the backend has no"),
        ('"-np", "4"', "parallel = { min = 1, max = 4 }", "never uses {parallel}"),
        ('"-np", "{parallel}"', "parallel = { min = 4, max = 2 }", "needs 1 <= min <= max"),
        ('"-np", "{parallel}"', "parallel = { min = 0, max = 2 }", "needs 1 <= min <= max"),
        ('"-np", "{parallel}"', "parallel = { max = 2 }", "must be a table { min = N, max = M }"),
        ('"-np", "{parallel}"', "parallel = { min = 1.5, max = 2 }", "whole slot counts"),
        (
            '"-np", "{parallel}"',
            "slots = 4\nparallel = { min = 1, max = 4 }",
            "backends.llm.slots: and parallel are both set",
        ),
        (
            '"-c", "{total_context}"',
            "context = { min = 1024, max = 2048 }",
            "uses {total_context} (context x parallel slots) but the backend lacks",
        ),
    ],
)
def test_a_bad_range_is_an_error_naming_the_key(
    tmp_path: Path, arg: str, extra: str, error: str
) -> None:
    errors = errors_of(tmp_path, LLM.format(arg=arg, extra=extra))
    assert any(error in e for e in errors), errors


def test_the_total_context_alone_does_not_pass_the_slot_count(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, LLM.format(arg='"-c", "{total_context}"', extra=RANGES))
    assert any(
        "backends.llm.parallel: is set but the command never uses {parallel}" in e for e in errors
    ), errors

"""The input file checked line by line: each of OpenAI's errors, with its line."""

from __future__ import annotations

import json

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from yard.batches import validate
from yard.batches.validate import MAX_ERRORS, Checked, check_input

ENDPOINT = "/v1/chat/completions"
ROUTES = {"tiny": "llm", "small": "llm2"}


def _line(custom_id: object = "a", *, model: object = "tiny", **over: object) -> dict[str, object]:
    line: dict[str, object] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
    }
    line.update(over)
    return line


def _file(*lines: object) -> bytes:
    return b"\n".join(x if isinstance(x, bytes) else json.dumps(x).encode() for x in lines)


def _check(
    content: bytes, *, max_lines: int = 100, max_request_bytes: int | None = None
) -> Checked:
    return check_input(
        content,
        endpoint=ENDPOINT,
        route=ROUTES.get,
        max_lines=max_lines,
        max_request_bytes=max_request_bytes,
    )


def _errors(content: bytes, **kw: int) -> list[tuple[str, int | None, str | None]]:
    return [(e.code, e.line, e.param) for e in _check(content, **kw).errors]


def test_good_lines_are_grouped_by_model_in_the_order_models_first_appear() -> None:
    checked = _check(
        _file(_line("1", model="small"), _line("2"), _line("3", model="small"), _line("4"), b"  ")
        + b"\n"
    )
    assert checked.errors == ()
    assert [(p.custom_id, p.model, p.backend, p.line) for p in checked.lines] == [
        ("1", "small", "llm2", 1),
        ("3", "small", "llm2", 3),
        ("2", "tiny", "llm", 2),
        ("4", "tiny", "llm", 4),
    ]
    assert json.loads(checked.lines[0].body)["model"] == "small"


def test_an_empty_file_fails() -> None:
    assert _errors(b"") == [("empty_file", None, None)]
    assert _errors(b"\n \n") == [("empty_file", None, None)]


def test_invalid_json_names_its_line() -> None:
    assert _errors(_file(_line("1"), b"{not json", b"[1, 2]")) == [
        ("invalid_json_line", 2, None),
        ("invalid_json_line", 3, None),
    ]


def test_each_missing_field_is_named() -> None:
    lines = []
    for name in ("custom_id", "method", "url", "body"):
        line = _line(name)
        del line[name]
        lines.append(line)
    assert _errors(_file(*lines)) == [
        ("missing_required_parameter", 1, "custom_id"),
        ("missing_required_parameter", 2, "method"),
        ("missing_required_parameter", 3, "url"),
        ("missing_required_parameter", 4, "body"),
    ]


def test_a_missing_or_bad_model_and_custom_id() -> None:
    no_model = _line("x")
    assert isinstance(no_model["body"], dict)
    del no_model["body"]["model"]
    assert _errors(
        _file(no_model, _line("y", model=7), _line("z", model="huge"), _line(3), _line(""))
    ) == [
        ("missing_required_parameter", 1, "body.model"),
        ("invalid_request", 2, "body.model"),
        ("model_not_found", 3, "body.model"),
        ("invalid_request", 4, "custom_id"),
        ("invalid_request", 5, "custom_id"),
    ]


def test_duplicate_custom_id_names_the_second_line_and_the_first() -> None:
    checked = _check(_file(_line("a"), _line("b"), _line("a")))
    assert [(e.code, e.line) for e in checked.errors] == [("duplicate_custom_id", 3)]
    assert "line 1" in checked.errors[0].message
    assert checked.lines == ()


def test_wrong_method_and_a_url_that_is_not_the_batch_endpoint() -> None:
    assert _errors(
        _file(_line("a", method="GET"), _line("b", url="/v1/embeddings"), _line("c", url=5))
    ) == [
        ("invalid_method", 1, "method"),
        ("url_mismatch", 2, "url"),
        ("invalid_request", 3, "url"),
    ]


def test_body_must_be_an_object_and_fit_a_job() -> None:
    assert _errors(_file(_line("a", body="hi"))) == [("invalid_request", 1, "body")]
    assert _errors(_file(_line("a")), max_request_bytes=10) == [("request_too_large", 1, "body")]


def test_too_many_lines() -> None:
    assert _errors(_file(*(_line(str(i)) for i in range(4))), max_lines=3) == [
        ("too_many_tasks", None, None)
    ]


def test_the_error_list_is_capped_and_says_how_many_more() -> None:
    errors = _check(b"\n".join(b"{" for _ in range(MAX_ERRORS + 5)), max_lines=5000).errors
    assert len(errors) == MAX_ERRORS
    assert errors[-1].code == "too_many_errors"
    assert errors[-1].message == "6 more errors"


def test_a_long_file_is_checked_with_a_pause_every_hundred_lines() -> None:
    pauses: list[int] = []
    content = _file(*(_line(str(i)) for i in range(250)))
    checked = check_input(
        content,
        endpoint=ENDPOINT,
        route=lambda model: "llm",
        max_lines=1000,
        pause=lambda: pauses.append(1),
    )
    assert len(checked.lines) == 250 and not checked.errors
    assert len(pauses) == 2


def _every_line(content: bytes) -> list[tuple[int, bytes]]:
    """The requests of ``content`` as one split of the whole file numbers them."""
    return [(i + 1, t) for i, t in enumerate(content.split(b"\n")) if t.strip()]


@settings(max_examples=300, deadline=None)
@given(
    content=st.lists(st.sampled_from([b"\n", b"\r\n", b" ", b"\t", b"{}", b"ab", b"x" * 9])).map(
        b"".join
    ),
    piece=st.integers(1, 12),
)
def test_a_file_split_a_piece_at_a_time_numbers_its_lines_as_one_split_does(
    content: bytes, piece: int
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validate, "SPLIT_BYTES", piece)
        assert list(validate._lines(content, None)) == _every_line(content)
        over = len(_every_line(content))
        if over:
            assert validate._too_many(content, over - 1, None) == over
        assert validate._too_many(content, over, None) is None


def test_a_big_file_hands_over_the_gil_while_it_is_split() -> None:
    # 80 lines of 16 KiB, 1.3 MiB (under PAUSE_EVERY: no pause between checked lines).
    # Split in one piece, one bytes.split held the GIL, and so the event
    # loop, for the whole file: 80 ms for 50 MiB; now a piece at a time.
    text = "x" * 16 * 2**10
    content = _file(*(_line(str(i), body={"model": "tiny", "input": text}) for i in range(80)))
    pauses: list[int] = []
    checked = check_input(
        content,
        endpoint=ENDPOINT,
        route=ROUTES.get,
        max_lines=100,
        pause=lambda: pauses.append(1),
    )
    assert checked.errors == () and len(checked.lines) == 80
    assert len(content) > 4 * validate.SPLIT_BYTES
    assert len(pauses) >= 3  # between the pieces, as the lines are counted and split

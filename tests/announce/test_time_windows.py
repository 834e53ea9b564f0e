"""Time windows on requests and jobs: the headers, and a job held until its
window opens across a restart (real engine and core, virtual time)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.jobs.harness import proxy_request
from tests.jobs.test_real_engine import yard
from yard.api.intake import check_window, parse_not_before, parse_start_by
from yard.errors import Rejected
from yard.testing.upstream import Answer, FakeUpstream

NOW = 100.0  # engine clock
WALL = 1_796_306_400.0  # 2026-12-03T14:00:00Z


def test_start_after_is_seconds_from_now_with_a_readable_label() -> None:
    assert parse_not_before(NOW, None, b"600", wall=WALL) == (
        700.0,
        "14:10:00Z (X-Yard-Start-After)",
    )


def test_not_before_is_an_rfc3339_time_on_the_engine_clock() -> None:
    at, label = parse_not_before(NOW, b"2026-12-03T13:50:00Z", None, wall=WALL - 1200)
    assert at == NOW + 600
    assert label == "13:50:00Z (X-Yard-Not-Before)"
    # another day: the whole time
    _, label = parse_not_before(NOW, b"2026-12-05T13:50:00+00:00", None, wall=WALL)
    assert label == "2026-12-05T13:50:00Z (X-Yard-Not-Before)"


def test_neither_header_is_no_window() -> None:
    assert parse_not_before(NOW, None, None, wall=WALL) == (None, "")


@pytest.mark.parametrize(
    ("not_before", "start_after", "says"),
    [
        (b"2026-12-03T13:50:00Z", b"5", "either X-Yard-Not-Before or X-Yard-Start-After"),
        (b"13:50", None, "X-Yard-Not-Before must be an RFC 3339 time with a zone"),
        (b"2026-12-03T13:50:00", None, "X-Yard-Not-Before must be an RFC 3339 time with a zone"),
        (None, b"-1", "X-Yard-Start-After must be a number of seconds >= 0"),
        (None, b"nan", "X-Yard-Start-After must be a number of seconds >= 0"),
        (None, b"1e300", "X-Yard-Start-After is out of range"),
    ],
)
def test_bad_window_headers_are_400s(
    not_before: bytes | None, start_after: bytes | None, says: str
) -> None:
    with pytest.raises(Rejected) as caught:
        parse_not_before(NOW, not_before, start_after, wall=WALL)
    assert (caught.value.status, caught.value.code) == (400, "invalid_window")
    assert says in caught.value.message


def test_a_window_that_closes_before_it_opens_is_a_400() -> None:
    opens, _ = parse_not_before(NOW, None, b"60", wall=WALL)
    closes = parse_start_by(NOW, None, b"30", wall=WALL)
    with pytest.raises(Rejected) as caught:
        check_window(opens, closes)
    assert (caught.value.status, caught.value.code) == (400, "invalid_window")
    check_window(opens, parse_start_by(NOW, None, b"90", wall=WALL))
    check_window(opens, None)
    check_window(None, closes)


async def test_a_job_is_held_until_its_window_opens_even_across_a_restart(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    upstream = FakeUpstream(Answer(delay=1.0))
    request = dataclasses.replace(
        proxy_request(), not_before=300.0, window_label="00:05:00Z (X-Yard-Not-Before)"
    )
    async with yard(tmp_path, upstream) as jobs:
        handed_in = await jobs.submit(request, rerun_safe=False)
        job_id = str(handed_in["id"])
        assert handed_in["not_before"] == "2026-01-01T00:05:00.000Z"
        await trio.sleep(50)
        shown = jobs.describe(await jobs.get(job_id, app="radio"))
        assert shown["status"] == "queued"
        assert shown["reason"] == "held until 2026-01-01T00:05:00.000Z (X-Yard-Not-Before)"
        assert shown["estimated_start"] == "2026-01-01T00:05:00.000Z"
    assert upstream.calls == []
    await trio.sleep(100)  # yard was down from 50 s to 150 s
    async with yard(tmp_path, upstream) as jobs:
        await jobs.wait_ended(job_id, app="radio")
    # tts loads ahead (5 s measured, 30 s assumed: at 300 - 30 - 2) and the job
    # starts when its window opens, not before
    assert [call.at for call in upstream.calls] == [300.0]

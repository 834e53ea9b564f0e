"""An Admission's moves, the engine's book of them, and the one turn loop."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from yard.admission import (
    Admission,
    AdmissionBook,
    Assignment,
    ResponseCut,
    UpstreamLost,
    run_turn,
)
from yard.core.events import Event, RequestCancelled, RequestFinished
from yard.errors import Rejected

WHERE = Assignment(request_id="r1", backend="tts", base_url="http://tts")


def admitted(book: AdmissionBook, events: list[Event], request_id: str = "r1") -> Admission:
    admission = Admission(
        request_id=request_id, backend="tts", arrived_at=0.0, send=events.append, book=book
    )
    book.enter(admission)
    return admission


def counts(book: AdmissionBook) -> tuple[int, int, dict[str, int], int]:
    return book.queued, book.inflight, dict(book.outcomes), len(book)


def test_the_book_follows_every_move_and_forgets_ended_requests() -> None:
    book = AdmissionBook()
    events: list[Event] = []
    a, b, c = (admitted(book, events, rid) for rid in ("a", "b", "c"))
    assert counts(book) == (3, 0, {}, 3)
    a._dispatched(WHERE, 1.0)
    b._dispatched(WHERE, 2.0)
    assert counts(book) == (1, 2, {}, 3)
    a.report("upstream_lost", "reset")  # waits for the verdict: counted as waiting
    assert counts(book) == (2, 1, {}, 3)
    a._requeued()
    assert counts(book) == (2, 1, {}, 3)
    b.report("ok")
    c.cancel()
    assert counts(book) == (1, 0, {"ok": 1, "cancelled": 1}, 1)
    a._reject(Rejected(502, "backend_failed", "it crashed"))
    assert counts(book) == (0, 0, {"ok": 1, "cancelled": 1, "rejected": 1}, 0)
    assert book.get("a") is None
    assert [type(e) for e in events] == [RequestFinished, RequestFinished, RequestCancelled]
    # Reports after the end are dropped, never sent twice.
    b.report("error")
    a.cancel()
    assert len(events) == 3


def test_an_illegal_move_names_the_request_and_both_states() -> None:
    book = AdmissionBook()
    admission = admitted(book, [])
    with pytest.raises(RuntimeError, match="r1: no move from queued to done"):
        admission._move("done")
    with pytest.raises(ValueError, match="already in use"):
        book.enter(Admission(request_id="r1", backend="x", arrived_at=0, send=print, book=book))


def test_closing_the_book_ends_every_request_uncounted() -> None:
    book = AdmissionBook()
    a, b = admitted(book, [], "a"), admitted(book, [], "b")
    b._dispatched(WHERE, 1.0)
    book.close(Rejected(503, "shutting_down", "bye"))
    assert counts(book) == (0, 0, {}, 0)
    assert (a.state, b.state) == ("rejected", "rejected")


async def test_wait_verdict_wakes_at_the_moment_of_the_verdict(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = AdmissionBook()
    requeued, failed = admitted(book, [], "a"), admitted(book, [], "b")
    for admission in (requeued, failed):
        admission._dispatched(WHERE, 0.0)
        admission.report("upstream_lost", "reset")
    verdicts: list[tuple[str, bool, float]] = []

    async def wait(admission: Admission) -> None:
        verdicts.append((admission.request_id, await admission.wait_verdict(), trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, requeued)
        nursery.start_soon(wait, failed)
        await trio.sleep(3.0)
        requeued._requeued()
        await trio.sleep(1.5)
        failed._reject(Rejected(502, "backend_failed", "it crashed"))
    # No polling: each wakes exactly when its verdict came.
    assert verdicts == [("a", True, 3.0), ("b", False, 4.5)]


async def test_run_turn_goes_again_after_a_requeue_and_reports_each_try_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = AdmissionBook()
    events: list[Event] = []
    admission = admitted(book, events)
    tries: list[float] = []
    requeues: list[float] = []

    async def attempt(assignment: Assignment) -> None:
        tries.append(trio.current_time())
        if len(tries) == 1:
            raise UpstreamLost("connection reset")

    async def on_requeued() -> None:
        requeues.append(trio.current_time())

    async def core() -> None:
        await trio.sleep(1.0)
        admission._dispatched(WHERE, 1.0)
        await trio.sleep(2.0)  # the verdict after the lost report
        admission._requeued()
        await trio.sleep(4.0)
        admission._dispatched(WHERE, 7.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(core)
        outcome = await run_turn(admission, attempt, on_requeued=on_requeued)
    assert outcome == "ok"
    assert tries == [1.0, 7.0] and requeues == [3.0]
    assert [(e.outcome, e.detail) for e in events if isinstance(e, RequestFinished)] == [
        ("upstream_lost", "connection reset"),
        ("ok", ""),
    ]
    assert counts(book) == (0, 0, {"ok": 1}, 0)


async def test_run_turn_reports_a_cut_response_as_error_and_raises_a_refusal() -> None:
    book = AdmissionBook()
    events: list[Event] = []
    cut, refused = admitted(book, events, "cut"), admitted(book, events, "refused")
    cut._dispatched(WHERE, 0.0)
    refused._reject(Rejected(504, "deadline_missed", "too late"))

    async def attempt(assignment: Assignment) -> None:
        raise ResponseCut("reset after 3 chunks")

    assert await run_turn(cut, attempt) == "error"
    with pytest.raises(Rejected) as caught:
        await run_turn(refused, attempt)
    assert caught.value.code == "deadline_missed"
    assert [(e.outcome, e.detail) for e in events if isinstance(e, RequestFinished)] == [
        ("error", "reset after 3 chunks")
    ]
    assert counts(book) == (0, 0, {"error": 1, "rejected": 1}, 0)


async def test_without_on_requeued_a_lost_turn_waits_for_the_next_dispatch_or_its_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    book = AdmissionBook()
    admission = admitted(book, [])
    admission._dispatched(WHERE, 0.0)

    async def attempt(assignment: Assignment) -> None:
        raise UpstreamLost("reset")

    async def core() -> None:
        await trio.sleep(2.0)
        admission._reject(Rejected(502, "backend_failed", "it crashed"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(core)
        with pytest.raises(Rejected) as caught:
            await run_turn(admission, attempt)
    assert caught.value.code == "backend_failed" and trio.current_time() == 2.0

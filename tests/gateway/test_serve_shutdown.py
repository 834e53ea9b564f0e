"""What each stop signal does to ``yard serve`` at each stage (:class:`yard.app.serve.Shutdown`),
without processes: a scope stands for yard's nursery, a list for the supervisor's hurry."""

from __future__ import annotations

import trio

from yard.app.serve import Shutdown


def _attached(serving: bool) -> tuple[Shutdown, trio.CancelScope, list[str]]:
    shutdown, everything, hurried = Shutdown(), trio.CancelScope(), []
    shutdown.attach(everything, hurry=lambda: hurried.append("hurry"))
    if serving:
        shutdown.serving()
    return shutdown, everything, hurried


async def test_a_first_signal_while_serving_asks_for_a_graceful_stop() -> None:
    shutdown, everything, hurried = _attached(serving=True)
    shutdown.signal("SIGTERM")
    assert shutdown.requested.is_set()
    assert not everything.cancel_called  # in-flight requests get their grace
    assert hurried == []


async def test_a_second_signal_cuts_the_graces() -> None:
    shutdown, everything, hurried = _attached(serving=True)
    shutdown.signal("SIGTERM")
    shutdown.signal("SIGINT")
    assert everything.cancel_called
    assert hurried == ["hurry"]
    shutdown.signal("SIGTERM")
    assert hurried == ["hurry", "hurry"]


async def test_a_signal_before_yard_serves_cancels_the_start_up() -> None:
    shutdown, everything, hurried = _attached(serving=False)
    shutdown.signal("SIGHUP")
    assert shutdown.requested.is_set()
    assert everything.cancel_called
    assert hurried == []


async def test_a_signal_before_anything_is_attached_is_remembered() -> None:
    shutdown = Shutdown()
    shutdown.signal("SIGTERM")
    assert shutdown.requested.is_set()

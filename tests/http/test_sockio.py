"""yard.h1.sockio: the hot path's socket calls, over real socket pairs."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from yard.h1 import sockio


def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def test_bytes_already_waiting_are_read_and_a_closed_peer_reads_empty() -> None:
    left, right = _pair()
    async with left, right:
        await right.send_all(b"hello")
        assert sockio.read_now(left, 100) == b"hello"
        assert sockio.read_now(left, 100) is None  # nothing more, and no wait
        await right.aclose()
        assert await sockio.receive_some(left, 100) == b""


async def test_a_read_with_nothing_waiting_waits_for_the_bytes() -> None:
    left, right = _pair()
    async with left, right:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await sockio.receive_some(left, 100))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            await right.send_all(b"late")
        assert got == [b"late"]


async def test_a_reader_that_always_finds_bytes_yields_once_every_16_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    left, right = _pair()
    async with left, right:
        await right.send_all(b"x" * 100)
        monkeypatch.setattr(sockio, "_fast_ops", 0)
        for _ in range(2):
            with trio.testing.assert_no_checkpoints():
                for _ in range(16):
                    assert await sockio.receive_some(left, 1) == b"x"
            # The 17th read is a checkpoint (so other tasks run), though
            # bytes are waiting.
            with trio.testing.assert_checkpoints():
                assert await sockio.receive_some(left, 1) == b"x"


async def test_a_writer_the_kernel_always_takes_from_yields_once_every_16_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    left, right = _pair()
    async with left, right:
        monkeypatch.setattr(sockio, "_fast_ops", 0)
        for _ in range(2):
            with trio.testing.assert_no_checkpoints():
                for _ in range(16):
                    await sockio.send_all(left, b"x")
            with trio.testing.assert_checkpoints():
                await sockio.send_all(left, b"x")
        assert await right.receive_some(100) == b"x" * 34


async def test_a_write_that_stalls_raises_too_slow_after_stall_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    left, right = _pair()
    async with left, right:
        t0 = trio.current_time()
        with pytest.raises(trio.TooSlowError):
            await sockio.send_all(left, b"x" * (8 << 20), stall_s=30.0)
        assert trio.current_time() - t0 == 30.0


async def test_a_write_larger_than_the_socket_buffer_arrives_whole_and_in_order() -> None:
    left, right = _pair()
    payload = bytes(range(256)) * (16 * 1024)  # 4 MiB: many partial writes
    async with left, right:
        received = bytearray()

        async def drain() -> None:
            while len(received) < len(payload):
                data = await right.receive_some(65536)
                assert data
                received.extend(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await sockio.send_all(left, payload)
        assert bytes(received) == payload


async def test_a_broken_connection_and_a_closed_socket_raise_like_trio() -> None:
    left, right = _pair()
    async with left:
        # Writing to a peer that is gone is a broken resource...
        right.socket.close()
        with pytest.raises(trio.BrokenResourceError):
            await sockio.send_all(left, b"more")
    # ... and a socket yard closed itself is a closed one.
    with pytest.raises(trio.ClosedResourceError):
        sockio.read_now(left, 100)
    with pytest.raises(trio.ClosedResourceError):
        await sockio.send_all(left, b"x")

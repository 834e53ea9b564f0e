"""Socket reads and writes that skip Trio's run loop when the kernel is ready.

Trio makes every socket operation a checkpoint: a ``recv`` that finds bytes
waiting, or a ``send`` the kernel takes at once, still yields to the
scheduler afterwards, which costs a trip through the run loop (an
``epoll_wait`` and the loop's own bookkeeping). On the proxy's hot path that
trip is the largest single cost after parsing, and on a CPU that just woke up
from idle it takes tens of microseconds. These helpers try the operation on
the raw file descriptor first and only fall back to Trio's (which waits and
checkpoints properly) when the kernel is not ready.

Rules they keep:

- The bytes and errors are those of the plain stream calls: a reset or a
  closed peer raises ``trio.BrokenResourceError`` and a socket yard closed
  ``trio.ClosedResourceError``, as ``SocketStream`` does.
- Fairness: a task that finds its socket always ready still yields every
  ``_YIELD_EVERY`` operations, so a client that floods yard cannot keep the
  run loop from other tasks.
- Cancellation is seen at those yields and whenever an operation has to
  wait; a fast operation between them does not check for it (like a plain
  function call would not).
- A caller that needs a deadline on a read uses :func:`receive_now` and puts
  its cancel scope only around the waiting half, so a read the kernel
  answers at once costs no scope. A write's limit is on progress
  (``stall_s``), which only the loop that writes can see.
"""

from __future__ import annotations

import math
import os

import trio

_YIELD_EVERY = 16
_fast_ops = 0


def receive_now(stream: trio.SocketStream, max_bytes: int) -> bytes | None:
    """The bytes waiting on the socket now (``b""``: the peer closed), within
    the fairness budget; None when the caller must wait (or yield) through
    ``stream.receive_some(max_bytes)``. Never checkpoints."""
    global _fast_ops
    if _fast_ops < _YIELD_EVERY:
        data = read_now(stream, max_bytes)  # (a closed socket raises, as trio's)
        if data is not None:
            _fast_ops += 1
            return data
    _fast_ops = 0
    return None


async def receive_some(stream: trio.SocketStream, max_bytes: int) -> bytes:
    """Like ``stream.receive_some(max_bytes)``; ``b""`` when the peer closed."""
    data = receive_now(stream, max_bytes)
    if data is not None:
        return data
    return await stream.receive_some(max_bytes)


def read_now(stream: trio.SocketStream, max_bytes: int) -> bytes | None:
    """The bytes waiting on the socket now (``b""``: the peer closed), or
    None when there are none; never waits, never checkpoints."""
    fd = stream.socket.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    try:
        return os.read(fd, max_bytes)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise trio.BrokenResourceError(str(exc)) from exc


def _write_now(stream: trio.SocketStream, data: bytes | memoryview) -> int:
    fd = stream.socket.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise trio.BrokenResourceError(str(exc)) from exc


async def send_all(stream: trio.SocketStream, data: bytes, *, stall_s: float = math.inf) -> None:
    """Like ``stream.send_all(data)``.

    ``stall_s``: give up with ``trio.TooSlowError`` when the peer takes no
    byte for this long (some of ``data`` may have gone). A deadline around
    the whole call would also cut a slow reader that keeps reading; this
    one only cuts a peer that stopped.
    """
    global _fast_ops
    sent = 0
    if _fast_ops < _YIELD_EVERY:
        sent = _write_now(stream, data)
        if sent == len(data):
            _fast_ops += 1
            return
    _fast_ops = 0
    if stream.socket.fileno() < 0:
        raise trio.ClosedResourceError("the socket was closed")
    rest = memoryview(data)[sent:]
    with trio.CancelScope() as waiting:
        while rest:
            waiting.deadline = trio.current_time() + stall_s
            # A checkpoint even when the socket is writable: the yield that
            # keeps a fast writer fair.
            await trio.lowlevel.wait_writable(stream.socket)
            rest = rest[_write_now(stream, rest) :]
    if waiting.cancelled_caught:
        raise trio.TooSlowError(f"the peer took nothing for {stall_s:g} s")

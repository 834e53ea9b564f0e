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
"""

from __future__ import annotations

import os

import trio

_YIELD_EVERY = 16
_fast_ops = 0


async def receive_some(stream: trio.SocketStream, max_bytes: int) -> bytes:
    """Like ``stream.receive_some(max_bytes)``; ``b""`` when the peer closed."""
    global _fast_ops
    if _fast_ops < _YIELD_EVERY:
        data = read_now(stream, max_bytes)  # (a closed socket raises, as trio's)
        if data is not None:
            _fast_ops += 1
            return data
    _fast_ops = 0
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


async def send_all(stream: trio.SocketStream, data: bytes) -> None:
    """Like ``stream.send_all(data)``."""
    global _fast_ops
    fd = stream.socket.fileno()
    if _fast_ops < _YIELD_EVERY and fd >= 0:
        try:
            sent = os.write(fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc
        if sent == len(data):
            _fast_ops += 1
            return
        data = data[sent:]
    _fast_ops = 0
    await stream.send_all(data)

"""The test client of :mod:`yard.testing.client`: a server that dies while a
request body is being sent leaves no half-used async generator behind."""

from __future__ import annotations

import functools
import gc
import warnings

import httpx
import pytest
import trio

from yard.testing.client import client as plain_body_client

BODY = b"x" * (16 * 2**20)  # far more than the socket buffers take at once


async def _read_a_little_then_reset(stream: trio.SocketStream) -> None:
    await stream.receive_some(1024)
    # SO_LINGER 0: close with a reset, so the client's next write fails.
    stream.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
    await stream.aclose()


async def _abandoned_generators(client: httpx.AsyncClient) -> list[str]:
    """POST ``BODY`` to a server that hangs up mid-body; the ResourceWarnings
    Trio raised about generators collected unfinished."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with client:
            with pytest.raises(httpx.TransportError):
                await client.post("/v1/chat/completions", content=BODY)
        gc.collect()
        await trio.lowlevel.checkpoint()  # Trio closes what it collected in a task
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.mark.slow
async def test_a_server_dying_mid_body_leaves_no_unfinished_async_generator() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, _read_a_little_then_reset, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        with trio.fail_after(30):
            plain = await _abandoned_generators(httpx.AsyncClient(base_url=url))
            ours = await _abandoned_generators(plain_body_client(url))
        nursery.cancel_scope.cancel()
    # The control: httpx's own body does leave one (encode/httpx#3686)...
    assert any("ByteStream.__aiter__" in message for message in plain), plain
    # ...and the client the kill test uses does not.
    assert ours == []

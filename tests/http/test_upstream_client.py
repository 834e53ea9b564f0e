"""The upstream client's HTTP/1.1 framing against scripted backends: every
way a response can end, answers split at awkward places, and broken ones."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pytest
import trio

from yard.h1.upstream import UpstreamError, UpstreamPool


async def _scripted(
    pieces: Sequence[bytes],
    received: list[bytes],
    stream: trio.SocketStream,
) -> None:
    received.append(await stream.receive_some(65536))
    for piece in pieces:
        await stream.send_all(piece)
        await trio.sleep(0.01)  # the next piece arrives in a read of its own
    await stream.aclose()


async def _fetch(
    pieces: Sequence[bytes], *, method: bytes = b"GET"
) -> tuple[int, list[tuple[bytes, bytes]], list[bytes], bytes, bool]:
    received: list[bytes] = []
    pool = UpstreamPool()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(
                trio.serve_tcp, functools.partial(_scripted, pieces, received), 0, host="127.0.0.1"
            )
        )
        port = listeners[0].socket.getsockname()[1]
        failure: UpstreamError | None = None
        try:
            async with pool.request(
                f"http://127.0.0.1:{port}", method, b"/x?y=1", [(b"x-a", b"1")], b""
            ) as response:
                chunks = [chunk async for chunk in response.chunks()]
                reusable = response.reusable
        except UpstreamError as exc:
            failure = exc
        nursery.cancel_scope.cancel()
    pool.close_idle()
    if failure is not None:
        raise failure
    pool.close_idle()
    return response.status, response.headers, chunks, received[0], reusable


async def test_request_is_written_as_http11_with_host_and_headers() -> None:
    _, _, _, sent, _ = await _fetch([b"HTTP/1.1 204 No Content\r\n\r\n"])
    assert sent.startswith(b"GET /x?y=1 HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"\r\nx-a: 1\r\n" in sent
    assert sent.endswith(b"\r\n\r\n")
    assert b"content-length" not in sent


async def test_content_length_body_split_across_reads() -> None:
    status, headers, chunks, _, reusable = await _fetch(
        [b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-Up: a\r\n", b"\r\nhello", b" world"]
    )
    assert status == 200
    assert headers == [(b"content-length", b"11"), (b"x-up", b"a")]
    assert b"".join(chunks) == b"hello world"
    assert len(chunks) == 2  # streamed as it came, not gathered
    assert reusable


async def test_chunked_body_with_extensions_and_trailers_split_everywhere() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    pieces = [raw[i : i + 7] for i in range(0, len(raw), 7)]
    status, _, chunks, _, reusable = await _fetch(pieces)
    assert status == 200
    assert b"".join(chunks) == b"hello world"
    assert reusable


async def test_body_until_close_for_responses_without_length() -> None:
    _, _, chunks, _, reusable = await _fetch([b"HTTP/1.0 200 OK\r\n\r\npart1", b"part2"])
    assert b"".join(chunks) == b"part1part2"
    assert not reusable


async def test_informational_responses_are_skipped() -> None:
    status, _, chunks, _, _ = await _fetch(
        [
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ]
    )
    assert (status, b"".join(chunks)) == (200, b"ok")


async def test_head_response_has_no_body_whatever_its_length_says() -> None:
    status, _, chunks, _, reusable = await _fetch(
        [b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"], method=b"HEAD"
    )
    assert (status, chunks, reusable) == (200, [], True)


async def test_connection_close_header_makes_it_not_reusable() -> None:
    _, _, _, _, reusable = await _fetch(
        [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"]
    )
    assert not reusable


@pytest.mark.parametrize(
    ("pieces", "started"),
    [
        ([], False),
        ([b"HTTP/1.1 200 OK\r\nContent-"], False),
        ([b"garbage that is not http\r\n\r\n"], False),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"], True),
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"], True),
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"zz\r\n"], True),
        # Found bad before the response was handed over: nothing began.
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], False),
    ],
)
async def test_broken_answers_raise_upstream_error_saying_whether_a_response_began(
    pieces: list[bytes], started: bool
) -> None:
    with pytest.raises(UpstreamError) as caught:
        await _fetch(pieces)
    assert caught.value.response_started is started


async def test_conflicting_lengths_are_refused() -> None:
    with pytest.raises(UpstreamError):
        await _fetch([b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"])

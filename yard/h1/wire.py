"""HTTP/1.1 for the server side, sans I/O: bytes in, events out, bytes out.

(The client side, :class:`ClientConnection`, reads responses for yard's
upstream client; its rules are where it begins, below. Both sides read
heads, framing and bodies with one piece of code, ``_Reader``.)

The rules this module keeps:

- **No I/O.** :class:`ServerConnection` never touches a socket, a clock or
  trio. The caller feeds it what it read (:meth:`~ServerConnection.receive_data`,
  ``b""`` for end of file), pulls events (:meth:`~ServerConnection.next_event`)
  and writes the bytes the sending methods return.
- **Few Python operations per request.** This replaces h11 on the proxy's hot
  path (a new ``h11.Connection`` plus the parse of one small POST cost about
  32 µs warm). A head is found with ``bytes.find``, checked by a handful of
  precompiled regular expressions run once over the whole head, and split by
  ``re.findall``; no per-header regex objects, no validation layer per event.
  Whatever is rare (obsolete line folding, several ``Content-Length``
  headers, ``Transfer-Encoding``) takes a slower path only when it is there.
- **h11's reading of RFC 9112, except where noted.** The differential tests
  in ``tests/http/test_wire.py`` run the same bytes through both. The
  deliberate differences:

  * HTTP versions other than 1.0 and 1.1 are refused (505); h11 takes any
    ``HTTP/d.d``.
  * Empty lines before a request line are skipped, as RFC 9112 §2.2 asks of
    a robust server; h11 answers 400.
  * A request with both ``Transfer-Encoding`` and ``Content-Length`` is
    refused (400, RFC 9112 §6.3's guard against request smuggling); h11
    reads it as chunked.
  * ``Transfer-Encoding`` on an HTTP/1.0 request is refused (400): RFC 9112
    §6.1 says to treat such a message as faulty; h11 reads it as chunked.
  * A head longer than ``max_head`` is refused (431) even when it arrived
    complete in one read; h11 only checks what it still waits for.
  * Chunk sizes have at most 16 hex digits (h11: 20).
  * Trailers are checked as header lines, then dropped; what they say about
    framing is not looked at (h11 applies its header rules to them too).
  * After a request's end, bytes of a pipelined request wait (``PAUSED``)
    whether or not the connection will be kept; h11 raises on them when the
    connection must close.
  * ``Upgrade`` and ``CONNECT`` get no special treatment (no protocol
    switching): yard serves neither.
  * A response sent before any request (the answer to a
    :class:`ProtocolError`) always says ``connection: close``.
  * The framing headers this module adds are written in lower case
    (``transfer-encoding: chunked``, ``connection: close``); h11 title-cases
    them. Header names are case-insensitive, so the meaning is the same.

Events are small frozen records. The states (:data:`IDLE`,
:data:`SEND_RESPONSE`, :data:`SEND_BODY`, :data:`DONE`, :data:`MUST_CLOSE`,
:data:`CLOSED`, :data:`ERROR`) mean what they mean in h11: ``their_state`` is
the client's (the request), ``our_state`` the server's (the response). A
request/response cycle goes::

    client: IDLE --Request--> SEND_BODY --EndOfMessage--> DONE (MUST_CLOSE)
    server: IDLE --(request in)--> SEND_RESPONSE --response_head--> SEND_BODY
            --end--> DONE (MUST_CLOSE)

and :meth:`~ServerConnection.start_next_cycle` takes both from ``DONE`` back
to ``IDLE``. ``MUST_CLOSE`` replaces ``DONE`` when the connection will not be
kept alive; a client's end of file makes it ``CLOSED``; a malformed request
makes it ``ERROR``.

Run ``python -m yard.h1.wire`` for a side-by-side timing against h11.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import ClassVar, Final

__all__ = [
    "CLOSED",
    "DONE",
    "ERROR",
    "IDLE",
    "MUST_CLOSE",
    "NEED_DATA",
    "PAUSED",
    "SEND_BODY",
    "SEND_RESPONSE",
    "ClientConnection",
    "ConnectionClosed",
    "Data",
    "EndOfMessage",
    "Event",
    "LocalProtocolError",
    "ProtocolError",
    "Request",
    "Response",
    "ServerConnection",
    "Signal",
    "State",
]


# -- events --------------------------------------------------------------------


class Event:
    """Base of the events :meth:`ServerConnection.next_event` returns."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Request(Event):
    """A request's head.

    Attributes:
        method: as sent (a token; methods are case-sensitive).
        target: the request-target as sent, e.g. ``b"/v1/chat?x=1"``.
        http_version: ``b"1.1"`` or ``b"1.0"``.
        headers: ``(name, value)`` pairs in the order sent, names lower-cased,
            values without surrounding spaces or tabs. Folded lines are
            unfolded; equal ``Content-Length`` headers are kept once, with
            the single value (as h11 does).
    """

    method: bytes
    target: bytes
    http_version: bytes
    headers: list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Data(Event):
    """Some of the request's body, as it arrived (the body may come in any
    number of these; chunked framing is already removed)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class EndOfMessage(Event):
    """The request's body is complete (trailers, if any, are dropped)."""


@dataclass(frozen=True, slots=True)
class ConnectionClosed(Event):
    """The client closed its side between requests. Every later call to
    :meth:`ServerConnection.next_event` returns this again."""


_END_OF_MESSAGE: Final = EndOfMessage()
_CONNECTION_CLOSED: Final = ConnectionClosed()


class Signal(enum.Enum):
    """What :meth:`ServerConnection.next_event` returns when it has no event."""

    NEED_DATA = "NEED_DATA"
    PAUSED = "PAUSED"


#: Read more and pass it to :meth:`ServerConnection.receive_data`.
NEED_DATA: Final = Signal.NEED_DATA
#: The request is complete and bytes of another wait in the buffer: answer
#: this one, then :meth:`ServerConnection.start_next_cycle`.
PAUSED: Final = Signal.PAUSED


class State(enum.Enum):
    """Where one side of the connection is in its request/response cycle."""

    IDLE = "IDLE"
    SEND_RESPONSE = "SEND_RESPONSE"
    SEND_BODY = "SEND_BODY"
    DONE = "DONE"
    MUST_CLOSE = "MUST_CLOSE"
    CLOSED = "CLOSED"
    ERROR = "ERROR"


IDLE: Final = State.IDLE
SEND_RESPONSE: Final = State.SEND_RESPONSE
SEND_BODY: Final = State.SEND_BODY
DONE: Final = State.DONE
MUST_CLOSE: Final = State.MUST_CLOSE
CLOSED: Final = State.CLOSED
ERROR: Final = State.ERROR


class ProtocolError(Exception):
    """The client broke the protocol; answer ``status_hint`` (if no response
    has started) and close the connection.

    ``status_hint`` is 400 for a malformed request, 431 for a head over the
    limit, 501 for a transfer-coding other than chunked and 505 for an HTTP
    version other than 1.0 and 1.1.
    """

    def __init__(self, message: str, status_hint: int = 400) -> None:
        super().__init__(message)
        self.status_hint = status_hint


class LocalProtocolError(Exception):
    """The caller misused the connection: a response in the wrong state,
    more body than the declared ``Content-Length``, a line break inside a
    header, ... The response is broken: close the connection."""


# -- parsing -------------------------------------------------------------------

_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
# The whole head after CRLF -> LF; one search refuses what no line may hold.
# (h11 allows the other control bytes in header values; so do we.)
_BAD_BYTE = re.compile(rb"[\x00\r\x0b\x0c]")
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/([0-9]\.[0-9])")
# The fast path's: CRLF line ends only, no bad byte in a value.
_REQUEST_LINE_CRLF = re.compile(_REQUEST_LINE.pattern + rb"\r")
_FIELDS_CRLF = re.compile(rb"(?:" + _TOKEN + rb":[^\r\n\x00\x0b\x0c]*\r\n)*")
# Header lines, each ending in LF. A folded line starts with a space, so it
# fails here and takes the slow path.
_FIELDS = re.compile(rb"(?:" + _TOKEN + rb":[^\n]*\n)*")
_FIELD = re.compile(rb"([^:\n]*):[ \t]*([^\n]*?)[ \t]*\n")
_FOLD = re.compile(rb"\n[ \t]+")
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:;[^\n]*)?[ \t]*")
_MAX_LENGTH_DIGITS = 20

# Request body readers (ServerConnection._left): without _chunked, the
# Content-Length still to come; with it, > 0 is what is left of the chunk
# being read, the others are where in the chunked framing the reader is.
_CHUNK_SIZE = -1  # waiting for a chunk-size line
_CHUNK_CRLF = -2  # waiting for the CRLF after a chunk's data
_TRAILERS = -3  # waiting for the trailer section (maybe empty)
# Response writers (ServerConnection._out_left): >= 0 is the declared length
# still to send; bodiless responses are length 0.
_OUT_CHUNKED = -1
_OUT_UNTIL_CLOSE = -2


def _comma_tokens(values: list[bytes]) -> set[bytes]:
    """Lower-cased tokens of comma-separated header values (already lower)."""
    return {token.strip() for value in values for token in value.split(b",")}


def _content_length(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], int]:
    """The slow path for Content-Length: several headers or a list value.

    As h11: every header's comma-separated values must be one number, the
    same across headers; the first header stays, with that number alone."""
    seen: bytes | None = None
    kept: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        if name != b"content-length":
            kept.append((name, value))
            continue
        values = {part.strip() for part in value.split(b",")}
        if len(values) != 1:
            raise ProtocolError("conflicting Content-Length values")
        number = values.pop()
        if not number.isdigit() or len(number) > _MAX_LENGTH_DIGITS:
            raise ProtocolError("bad Content-Length")
        if seen is None:
            seen = number
            kept.append((name, number))
        elif number != seen:
            raise ProtocolError("conflicting Content-Length headers")
    assert seen is not None
    return kept, int(seen)


def _transfer_encoding(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Check that Transfer-Encoding is one header saying ``chunked``; return
    the headers with its value lower-cased (as h11 does)."""
    found = [value for name, value in headers if name == b"transfer-encoding"]
    if len(found) > 1:
        raise ProtocolError("several Transfer-Encoding headers", 501)
    if found[0].lower() != b"chunked":
        raise ProtocolError("only Transfer-Encoding: chunked is supported", 501)
    return [
        (name, b"chunked" if name == b"transfer-encoding" else value) for name, value in headers
    ]


def _joined(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The values of header ``name``, comma-joined, or None."""
    values = [value for found, value in headers if found == name]
    return b",".join(values) if values else None


def _head_end(buf: bytes, start: int) -> int:
    """Index of the LF that ends a head's last line (the blank line is LF LF
    or LF CRLF after it, as h11 reads it), or -1."""
    crlf = buf.find(b"\n\r\n", start)
    lf = buf.find(b"\n\n", start, crlf if crlf >= 0 else len(buf))
    return lf if lf >= 0 else crlf


def _unfold(block: bytes) -> bytes:
    """Header lines (each ending in LF, CRs and bad bytes already refused),
    checked, with obsolete line folding undone."""
    if _FIELDS.fullmatch(block) is None:
        # Obsolete line folding: unfold as h11 does (the continuation joins
        # the line before with one space), then the lines must be good.
        if block[:1] in (b" ", b"\t"):
            raise ProtocolError("continuation line at start of headers")
        block = _FOLD.sub(b" ", block)
        if _FIELDS.fullmatch(block) is None:
            raise ProtocolError("malformed header line")
    return block


# -- what both sides read ------------------------------------------------------


class _Reader:
    """The reading both sides share: the receive buffer, a message's head
    (start line and header lines) and its framing, and the body by length or
    in chunks.

    A subclass names its start line (``_START_LINE`` and its fast-path form
    ``_START_LINE_CRLF``, both with three groups) and what it reads
    (``_WHAT``, for error messages), and keeps its own states and rules on
    top. Body states: without ``_chunked``, ``_left`` is the length still to
    come; with it, > 0 is what is left of the chunk being read, the other
    values are where in the chunked framing the reader is.
    """

    __slots__ = (
        "_buf",
        "_chunked",
        "_eof",
        "_keep_alive",
        "_left",
        "_max_head",
        "_pos",
        "_searched",
        "their_state",
    )

    _START_LINE: ClassVar[re.Pattern[bytes]]
    _START_LINE_CRLF: ClassVar[re.Pattern[bytes]]
    _WHAT: ClassVar[str]  # "request" or "response"
    _PEER: ClassVar[str]  # "the client" or "the server"

    def __init__(self, max_head: int) -> None:
        self._max_head = max_head
        # Received bytes are _buf[_pos:]. While a head is incomplete it stays
        # in _buf, so each read copies it once more; max_head bounds that.
        self._buf = b""
        self._pos = 0
        self._searched = 0  # bytes of an incomplete head already searched
        self._eof = False
        self._keep_alive = True
        self._left = 0
        self._chunked = False
        self.their_state = IDLE

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as events."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        """Add bytes read from the peer; ``b""`` means it closed its side.

        Raises:
            RuntimeError: bytes after an end of file.
        """
        if data:
            if self._eof:
                raise RuntimeError("received data after the end of file")
            pos = self._pos
            if pos == len(self._buf):
                self._buf = data
            else:
                self._buf = self._buf[pos:] + data
            self._pos = 0
        else:
            self._eof = True

    def _head(self) -> tuple[tuple[bytes, bytes, bytes], list[tuple[bytes, bytes]]] | None:
        """The next head: its start line's three groups and its headers
        (names lower-cased, values stripped, folding undone); None while it is
        incomplete, and at an end of file before any byte of it.

        Raises:
            ProtocolError: a malformed head, one over ``max_head`` (431), or
                an end of file in the middle of one.
        """
        buf = self._buf
        pos = self._pos
        searched = self._searched
        start = pos + searched - 2 if searched > 2 else pos
        # The fast path: a head of CRLF lines, all well-formed. Anything else
        # (bare LFs, folding, a bad byte) fails one of its checks and takes
        # the exact path below, which reads heads the way h11 does, byte for
        # byte. Why "\n\r\n" is the end here: an earlier LF LF would leave an
        # empty line inside the fields, which _FIELDS_CRLF refuses.
        end = buf.find(b"\n\r\n", start)
        nl = buf.find(b"\n", pos, end + 1)  # the start line's end
        match = self._START_LINE_CRLF.fullmatch(buf, pos, nl) if end >= 0 else None
        if (
            match is not None
            and end - pos <= self._max_head
            and _FIELDS_CRLF.fullmatch(buf, nl + 1, end + 1) is not None
        ):
            self._searched = 0
            self._pos = end + 3
            headers = (
                [
                    (name.lower(), value.strip(b" \t"))
                    for name, _, value in [
                        line.partition(b":") for line in buf[nl + 1 : end - 1].split(b"\r\n")
                    ]
                ]
                if end > nl
                else []
            )
            return match.groups(), headers  # type: ignore[return-value]
        end = _head_end(buf, start)
        if end < 0 or end - pos > self._max_head:
            pending = len(buf) - pos
            if end >= 0 or pending > self._max_head:
                raise ProtocolError(f"{self._WHAT} head over {self._max_head} bytes", 431)
            if self._eof and pending:
                raise ProtocolError(f"{self._PEER} closed in the middle of a {self._WHAT} head")
            self._searched = pending
            return None
        self._searched = 0
        self._pos = end + (2 if buf[end + 1] == 10 else 3)
        text = buf[pos : end + 1].replace(b"\r\n", b"\n")
        if _BAD_BYTE.search(text) is not None:
            raise ProtocolError(f"a CR, NUL, VT or FF in the {self._WHAT} head")
        line, _, block = text.partition(b"\n")
        match = self._START_LINE.fullmatch(line)
        if match is None:
            raise ProtocolError(f"malformed {self._WHAT} start line: {line[:80]!r}")
        headers = [(name.lower(), value) for name, value in _FIELD.findall(_unfold(block))]
        return match.groups(), headers  # type: ignore[return-value]

    def _framing(
        self, headers: list[tuple[bytes, bytes]], fields: dict[bytes, bytes], http11: bool
    ) -> list[tuple[bytes, bytes]]:
        """Apply the framing rules both sides keep to a head's ``headers``
        (``fields`` is ``dict(headers)``): set the body reader (chunked, or
        the ``Content-Length``, 0 when there is none) and whether the
        connection is kept alive after this message. Returns the headers with
        ``Content-Length`` and ``Transfer-Encoding`` normalised as h11 does.

        Raises:
            ProtocolError: both framings (RFC 9112 §6.3, request smuggling),
                ``Transfer-Encoding`` in HTTP/1.0 (§6.1: faulty framing), a
                transfer-coding other than chunked (501), a bad or conflicting
                ``Content-Length``.
        """
        if len(fields) == len(headers):
            connection = fields.get(b"connection")
            length = fields.get(b"content-length")
        else:
            # A name repeats: join or count the slow way.
            connection = _joined(headers, b"connection")
            length = b"," if b"content-length" in fields else None
        chunked = b"transfer-encoding" in fields
        if chunked:
            if length is not None:
                raise ProtocolError("both Transfer-Encoding and Content-Length")
            if not http11:
                raise ProtocolError(f"Transfer-Encoding on an HTTP/1.0 {self._WHAT}")
            headers = _transfer_encoding(headers)
            self._left = _CHUNK_SIZE
        elif length is None:
            self._left = 0
        elif length.isdigit() and len(length) <= _MAX_LENGTH_DIGITS:
            self._left = int(length)
        else:
            headers, self._left = _content_length(headers)
        self._chunked = chunked
        keep_alive = http11
        if connection is not None:
            connection = connection.lower()
            if b"close" in connection and b"close" in _comma_tokens([connection]):
                keep_alive = False
        self._keep_alive = keep_alive
        return headers

    def _read_body(self) -> Event | Signal:
        """The next :class:`Data` or the :class:`EndOfMessage` of a body
        framed by length or by chunks."""
        if self._chunked:
            return self._read_chunked()
        left = self._left
        if not left:
            return self._end_of_message()
        buf = self._buf
        pos = self._pos
        have = len(buf) - pos
        if not have:
            if self._eof:
                raise ProtocolError(
                    f"{self._PEER} closed before the {self._WHAT} body's declared length"
                )
            return NEED_DATA
        if have <= left:
            self._pos = len(buf)
            self._left = left - have
            return Data(buf[pos:] if pos else buf)
        self._pos = pos + left
        self._left = 0
        return Data(buf[pos : pos + left])

    def _read_chunked(self) -> Event | Signal:
        buf = self._buf
        pos = self._pos
        end = len(buf)
        left = self._left
        parts: list[bytes] = []
        complete = False
        # As much of the body as is here goes out as one Data (h11 gives one
        # per chunk): fewer events for the caller to handle.
        while pos < end:
            if left > 0:
                take = min(left, end - pos)
                parts.append(buf[pos : pos + take])
                pos += take
                left -= take
                if not left:
                    left = _CHUNK_CRLF
            elif left == _CHUNK_CRLF:
                if end - pos < 2:
                    if buf[pos] != 13:
                        raise ProtocolError("malformed chunk end")
                    break
                if buf[pos] != 13 or buf[pos + 1] != 10:
                    raise ProtocolError("malformed chunk end")
                pos += 2
                left = _CHUNK_SIZE
            elif left == _CHUNK_SIZE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > self._max_head:
                        raise ProtocolError("chunk-size line too long")
                    break
                match = _CHUNK_LINE.fullmatch(buf, pos, eol)
                if match is None:
                    raise ProtocolError("malformed chunk-size line")
                pos = eol + 2
                left = int(match[1], 16) or _TRAILERS
            else:  # _TRAILERS
                if buf.startswith(b"\r\n", pos) or buf.startswith(b"\n", pos):
                    pos += 1 if buf[pos] == 10 else 2
                else:
                    last = _head_end(buf, pos)
                    if last < 0:
                        if end - pos > self._max_head:
                            raise ProtocolError("trailer section too large", 431)
                        break
                    text = buf[pos : last + 1].replace(b"\r\n", b"\n")
                    if _BAD_BYTE.search(text) is not None:
                        raise ProtocolError("a CR, NUL, VT or FF in the trailers")
                    _unfold(text)
                    pos = last + (2 if buf[last + 1] == 10 else 3)
                complete = True
                break
        self._pos = pos
        self._left = left
        if complete:
            # Read on as a body of length 0: the end goes out now, or on the
            # next call after this Data.
            self._left = 0
            self._chunked = False
        if parts:
            return Data(parts[0] if len(parts) == 1 else b"".join(parts))
        if complete:
            return self._end_of_message()
        if self._eof:
            raise ProtocolError(f"{self._PEER} closed in the middle of a chunked {self._WHAT} body")
        return NEED_DATA

    def _end_of_message(self) -> EndOfMessage:
        self.their_state = DONE if self._keep_alive else MUST_CLOSE
        return _END_OF_MESSAGE


# -- serializing ---------------------------------------------------------------


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


_STATUS_LINES: Final = {int(status): _status_line(status) for status in HTTPStatus}
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


# -- the connection ------------------------------------------------------------


class ServerConnection(_Reader):
    """The server's side of one HTTP/1.x connection.

    Feed it bytes, take events::

        conn.receive_data(data)              # b"" when the client closed
        event = conn.next_event()            # Request, Data..., EndOfMessage

    and answer with bytes to write::

        out = conn.response_head(200, [(b"content-type", b"text/plain")])
        out += conn.body(b"hello") + conn.end()

    then, when both sides are :data:`DONE`, :meth:`start_next_cycle` for the
    next request on the same connection. A :class:`ProtocolError` from
    :meth:`next_event` means the client sent garbage; a
    :class:`LocalProtocolError` from the sending methods means the caller
    broke the rules; either way the connection should close.

    ``their_state`` is the client's: :data:`IDLE` until a request's head is
    in, :data:`SEND_BODY` while its body comes, then :data:`DONE` (or
    :data:`MUST_CLOSE`), :data:`CLOSED` after its end of file, :data:`ERROR`
    after a :class:`ProtocolError`.

    Args:
        max_head: the longest request head (request line and headers, also
            a chunk-size line or trailer section) accepted, in bytes.
    """

    __slots__ = (
        "_http11",
        "_method",
        "_out_left",
        "our_state",
        "they_are_waiting_for_100_continue",
    )

    _START_LINE = _REQUEST_LINE
    _START_LINE_CRLF = _REQUEST_LINE_CRLF
    _WHAT = "request"
    _PEER = "the client"

    def __init__(self, *, max_head: int = 64 * 1024) -> None:
        _Reader.__init__(self, max_head)
        self._method: bytes | None = None
        self._http11 = False
        self._out_left = 0
        #: Ours: :data:`IDLE`, :data:`SEND_RESPONSE` once a request is in,
        #: :data:`SEND_BODY` after the head, then :data:`DONE` (or
        #: :data:`MUST_CLOSE`), :data:`ERROR` after a :class:`LocalProtocolError`.
        self.our_state = IDLE
        #: The request asked ``Expect: 100-continue`` and neither a response
        #: nor any of the body has gone by yet: send :meth:`informational_100`
        #: before waiting for the body.
        self.they_are_waiting_for_100_continue = False

    @property
    def keep_alive(self) -> bool:
        """Whether the connection can carry another request after this one:
        false for HTTP/1.0, after ``Connection: close`` from either side, a
        body that runs to the close, an end of file or an error."""
        return self._keep_alive

    # -- receiving -------------------------------------------------------------

    def next_event(self) -> Event | Signal:
        """The next event from what was received.

        Returns:
            :class:`Request`, then :class:`Data` (any number) and
            :class:`EndOfMessage`; :class:`ConnectionClosed` if the client
            closed between requests; :data:`NEED_DATA` when more bytes are
            needed; :data:`PAUSED` when a request is complete and bytes of
            the next wait for :meth:`start_next_cycle`. After a complete
            request with nothing buffered it is :data:`NEED_DATA` (as in
            h11): reading on shows the client hanging up
            (:class:`ConnectionClosed`).

        Raises:
            ProtocolError: a malformed request, or an end of file in the
                middle of one. The client's state becomes :data:`ERROR`
                and every later call raises again.
        """
        state = self.their_state
        try:
            if state is SEND_BODY:
                if not self.they_are_waiting_for_100_continue:
                    return self._read_body()
                event = self._read_body()
                if event is not NEED_DATA:
                    self.they_are_waiting_for_100_continue = False
                return event
            if state is IDLE:
                return self._read_head()
            if state is ERROR:
                raise ProtocolError("the connection is already broken")
            # DONE, MUST_CLOSE, CLOSED
            if self._pos < len(self._buf):
                return PAUSED
            if self._eof:
                self._closed()
                return _CONNECTION_CLOSED
            return NEED_DATA
        except ProtocolError:
            self.their_state = ERROR
            self._no_keep_alive()
            raise

    def _read_head(self) -> Event | Signal:
        buf = self._buf
        pos = self._pos
        if buf.startswith((b"\r", b"\n"), pos):
            # RFC 9112 §2.2: ignore empty lines before a request line.
            while buf.startswith(b"\r\n", pos) or buf.startswith(b"\n", pos):
                pos += 1 if buf[pos] == 10 else 2
            self._pos = pos
            self._searched = 0
        head = self._head()
        if head is None:
            if self._eof:
                self._closed()
                return _CONNECTION_CLOSED
            return NEED_DATA
        (method, target, version), headers = head
        http11 = version == b"1.1"
        if not http11 and version != b"1.0":
            raise ProtocolError("unsupported HTTP version", 505)
        # One dict answers "is there a header X?" for all the X that matter,
        # unless some name repeats: then count the slow way.
        fields = dict(headers)
        if len(fields) == len(headers):
            if http11 and b"host" not in fields:
                raise ProtocolError("missing Host header")
            expect = fields.get(b"expect")
        else:
            hosts = [value for name, value in headers if name == b"host"]
            if len(hosts) > 1 or (http11 and not hosts):
                raise ProtocolError("missing Host header" if not hosts else "several Host headers")
            expect = _joined(headers, b"expect")
        headers = self._framing(headers, fields, http11)
        if http11 and expect is not None:
            self.they_are_waiting_for_100_continue = b"100-continue" in _comma_tokens(
                [expect.lower()]
            )
        self._method = method
        self._http11 = http11
        self.their_state = SEND_BODY
        self.our_state = SEND_RESPONSE
        return Request(method, target, version, headers)

    def _closed(self) -> None:
        self.their_state = CLOSED
        self._no_keep_alive()

    def _no_keep_alive(self) -> None:
        self._keep_alive = False
        if self.our_state is DONE:
            self.our_state = MUST_CLOSE
        if self.their_state is DONE:
            self.their_state = MUST_CLOSE

    # -- sending ---------------------------------------------------------------

    def _misuse(self, message: str) -> LocalProtocolError:
        self.our_state = ERROR
        self._no_keep_alive()
        return LocalProtocolError(message)

    def informational_100(self) -> bytes:
        """``100 Continue``: the client may send the body it holds back.

        Raises:
            LocalProtocolError: not waiting to send a response.
        """
        if self.our_state is not SEND_RESPONSE:
            raise self._misuse(f"100 Continue in state {self.our_state.name}")
        self.they_are_waiting_for_100_continue = False
        return _CONTINUE

    def response_head(
        self, status: int, headers: list[tuple[bytes, bytes]], reason: bytes = b""
    ) -> bytes:
        """The status line and headers of the response, framing included.

        Also allowed before any request (state :data:`IDLE`), to answer a
        :class:`ProtocolError`; such a response is read as one to HTTP/1.0.

        Framing, as h11 does it: 204, 304 and answers to HEAD have no body;
        otherwise a ``content-length`` from the caller declares the body's
        length; ``transfer-encoding: chunked`` from the caller, or neither
        header for an HTTP/1.1 request, means chunked (``transfer-encoding:
        chunked`` is added, a ``content-length`` dropped); for HTTP/1.0 the
        body runs to the close. ``connection: close`` is added (any other
        ``Connection`` header merged into it) when the connection will not
        be kept alive.

        Args:
            status: 200 to 999 (1xx other than :meth:`informational_100` is
                not supported).
            headers: written in this order with names as given (lower-case
                is customary).
            reason: the reason phrase; the standard one when empty.

        Raises:
            LocalProtocolError: the wrong state, a bad status, a CR or LF in
                a header or the reason, a transfer-coding other than
                chunked, conflicting or malformed ``content-length``.
        """
        state = self.our_state
        if state is not SEND_RESPONSE and state is not IDLE:
            raise self._misuse(f"a response head in state {state.name}")
        if not 200 <= status <= 999:
            raise self._misuse(f"status {status} is not a final status")
        if reason:
            if b"\r" in reason or b"\n" in reason:
                raise self._misuse("a CR or LF in the reason phrase")
            line = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        else:
            line = _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status
        count = len(headers)
        # Every header joined in C; one count each for CR and LF proves no
        # name or value carries a line break of its own.
        text = b"\r\n".join(map(b": ".join, headers))
        if count and (text.count(b"\n") != count - 1 or text.count(b"\r") != count - 1):
            raise self._misuse("a CR or LF in a response header")
        low = b"\n" + text.lower()
        method = self._method
        http11 = self._http11
        head_only = method == b"HEAD"
        keep_alive = self._keep_alive and state is SEND_RESPONSE
        extra = b""
        if b"\ntransfer-encoding:" in low or b"\nconnection:" in low:
            return self._response_head_slow(line, status, headers, keep_alive)
        if status == 204 or status == 304:
            out_left = 0
        elif b"\ncontent-length:" in low:
            out_left = self._declared_length(headers)
        elif http11:
            out_left = _OUT_CHUNKED
            extra = b"transfer-encoding: chunked\r\n"
        else:
            out_left = _OUT_UNTIL_CLOSE
            if not head_only:
                keep_alive = False
        if head_only:
            out_left = 0
        if not keep_alive:
            extra += b"connection: close\r\n"
            self._no_keep_alive()
        self.they_are_waiting_for_100_continue = False
        self._out_left = out_left
        self.our_state = SEND_BODY
        if count:
            return b"%s%s\r\n%s\r\n" % (line, text, extra)
        return b"%s%s\r\n" % (line, extra)

    def _declared_length(self, headers: list[tuple[bytes, bytes]]) -> int:
        lengths = {
            part.strip()
            for name, value in headers
            if name.lower() == b"content-length"
            for part in value.split(b",")
        }
        number = lengths.pop()
        if lengths or not number.isdigit() or len(number) > _MAX_LENGTH_DIGITS:
            raise self._misuse("malformed or conflicting content-length")
        return int(number)

    def _response_head_slow(
        self, line: bytes, status: int, headers: list[tuple[bytes, bytes]], keep_alive: bool
    ) -> bytes:
        """response_head when the caller passed Transfer-Encoding or
        Connection: rebuild the headers the way h11 does."""
        head_only = self._method == b"HEAD"
        chunked = False
        has_length = False
        tokens: set[bytes] = set()
        for name, value in headers:
            low = name.lower()
            if low == b"transfer-encoding":
                if chunked or value.strip().lower() != b"chunked":
                    raise self._misuse("only one transfer-encoding: chunked is supported")
                chunked = True
            elif low == b"connection":
                tokens |= _comma_tokens([value.lower()])
            elif low == b"content-length":
                has_length = True
        dropped: set[bytes] = set()
        add_chunked = need_close = False
        if status == 204 or status == 304:
            out_left = 0  # h11 leaves a bodiless response's headers alone
        elif chunked or not has_length:
            dropped = {b"content-length", b"transfer-encoding"}
            if self._http11:
                out_left = _OUT_CHUNKED
                add_chunked = True
            else:
                out_left = _OUT_UNTIL_CLOSE
                need_close = not head_only
        else:
            out_left = self._declared_length(headers)
        if head_only:
            out_left = 0
        # As h11: the Connection headers are merged into one at the end only
        # when this side closes; one the caller sent that says close stays.
        rewrite = not keep_alive or need_close
        if rewrite:
            dropped.add(b"connection")
            tokens.discard(b"keep-alive")
            tokens.add(b"close")
        tokens.discard(b"")
        kept = [(name, value) for name, value in headers if name.lower() not in dropped]
        if add_chunked:
            kept.append((b"transfer-encoding", b"chunked"))
        if rewrite:
            kept.append((b"connection", b", ".join(sorted(tokens))))
        if b"close" in tokens:
            self._no_keep_alive()
        self.they_are_waiting_for_100_continue = False
        self._out_left = out_left
        self.our_state = SEND_BODY
        return line + b"".join([name + b": " + value + b"\r\n" for name, value in kept]) + b"\r\n"

    def body(self, data: bytes) -> bytes:
        """Some of the response body, framed: chunked, or as is.

        Raises:
            LocalProtocolError: no head sent yet, the response has no body
                (HEAD, 204, 304) or the data goes past its ``content-length``.
        """
        left = self._out_left
        if self.our_state is not SEND_BODY:
            raise self._misuse(f"body data in state {self.our_state.name}")
        if left == _OUT_CHUNKED:
            return b"%x\r\n%s\r\n" % (len(data), data) if data else b""
        if left >= 0:
            left -= len(data)
            if left < 0:
                raise self._misuse("more body than the declared length")
            self._out_left = left
        return data

    def end(self) -> bytes:
        """The end of the response: ``0 CRLF CRLF`` when chunked, else ``b""``.

        Raises:
            LocalProtocolError: no head sent yet, or less body than the
                declared ``content-length``.
        """
        left = self._out_left
        if self.our_state is not SEND_BODY:
            raise self._misuse(f"end of response in state {self.our_state.name}")
        if left > 0:
            raise self._misuse("less body than the declared length")
        self.our_state = DONE if self._keep_alive else MUST_CLOSE
        return b"0\r\n\r\n" if left == _OUT_CHUNKED else b""

    def start_next_cycle(self) -> None:
        """Get ready for the next request on this connection (bytes of it
        may be buffered already).

        Raises:
            LocalProtocolError: unless both sides are :data:`DONE` (the
                request read to its end, the response sent, keep-alive).
        """
        if self.their_state is not DONE or self.our_state is not DONE:
            raise LocalProtocolError(
                f"not ready for another request (client {self.their_state.name},"
                f" server {self.our_state.name})"
            )
        self.their_state = IDLE
        self.our_state = IDLE
        self._method = None


# -- the client side -------------------------------------------------------------
#
# yard's upstream client (yard.h1.upstream) reads its backends' responses with
# ClientConnection. A backend is trusted no more than a client: whatever it
# sends that could not go on to the client as a well-formed response is a
# ProtocolError here, before the client sees a byte of it. Deliberate
# differences from h11's reading (tests/http/test_wire.py runs both):
#
# * A response with both Transfer-Encoding and Content-Length is refused
#   (h11 reads it as chunked): a proxy that passed the Content-Length on
#   would frame the body wrongly. So is Transfer-Encoding in an HTTP/1.0
#   response (RFC 9112 §6.1: faulty framing; h11 reads it as chunked).
# * HTTP versions other than 1.0 and 1.1 are refused; so is 101 Switching
#   Protocols (yard proxies no upgrades). Other 1xx responses are skipped
#   (h11 hands them out as InformationalResponse).
# * A head longer than max_head is refused even when it came in one read.
# * Chunk sizes have at most 16 hex digits; trailers are checked as header
#   lines, then dropped (as on the server side).

_STATUS_LINE = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: ([^\n]*))?")
_STATUS_LINE_CRLF = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: ([^\r\n\x00\x0b\x0c]*))?\r")


@dataclass(frozen=True, slots=True)
class Response(Event):
    """A response's head (never a 1xx: those are skipped).

    Attributes:
        status: 200 to 999.
        reason: the reason phrase as sent (may be empty).
        http_version: ``b"1.1"`` or ``b"1.0"``.
        headers: ``(name, value)`` pairs in the order sent, names lower-cased,
            values without surrounding spaces or tabs; equal
            ``Content-Length`` headers kept once, ``Transfer-Encoding``'s
            value lower-cased (as h11 does).
    """

    status: int
    reason: bytes
    http_version: bytes
    headers: list[tuple[bytes, bytes]]


class ClientConnection(_Reader):
    """The client's side of one HTTP/1.x connection: reads the response to
    each request sent on it.

    Say a request went out, then feed bytes and take events::

        conn.request_sent(b"POST")
        conn.receive_data(data)              # b"" when the server closed
        event = conn.next_event()            # Response, Data..., EndOfMessage

    When the response has ended and :attr:`reusable` is true, the next
    request may go on the same connection. A :class:`ProtocolError` means the
    server's answer is not one yard can pass on; the connection is then
    useless.

    ``their_state`` is the server's: :data:`IDLE` before a request went out,
    :data:`SEND_RESPONSE` while its head is awaited, :data:`SEND_BODY`, then
    :data:`DONE` (kept alive) or :data:`MUST_CLOSE`; :data:`ERROR` after a
    :class:`ProtocolError`.

    Args:
        max_head: the longest response head (status line and headers, also
            a chunk-size line or trailer section) accepted, in bytes.
    """

    __slots__ = ("_method", "_to_close")

    _START_LINE = _STATUS_LINE
    _START_LINE_CRLF = _STATUS_LINE_CRLF
    _WHAT = "response"
    _PEER = "the server"

    def __init__(self, *, max_head: int = 64 * 1024) -> None:
        _Reader.__init__(self, max_head)
        self._method = b""
        self._to_close = False  # the body runs to the end of file

    @property
    def reusable(self) -> bool:
        """The response has ended, the server keeps the connection open, and
        no stray byte came after the response: a next request may go."""
        return self.their_state is DONE and self._pos == len(self._buf) and not self._eof

    def request_sent(self, method: bytes) -> None:
        """A request with ``method`` went out: its response comes next.

        Raises:
            LocalProtocolError: the previous response has not ended, or the
                connection cannot carry another request.
        """
        if self.their_state is not IDLE and not self.reusable:
            raise LocalProtocolError(f"no request can go out now (server {self.their_state.name})")
        self._method = method
        self.their_state = SEND_RESPONSE

    def next_event(self) -> Event | Signal:
        """The next event of the response.

        Returns:
            :class:`Response`, then :class:`Data` (any number, chunked
            framing removed) and :class:`EndOfMessage`; :data:`NEED_DATA`
            when more bytes are needed. After the end it is
            :data:`NEED_DATA` until the next :meth:`request_sent`.

        Raises:
            ProtocolError: the response is malformed, breaks a framing rule,
                or the server closed in the middle of it. The state becomes
                :data:`ERROR` and every later call raises again.
        """
        state = self.their_state
        try:
            if state is SEND_BODY:
                if self._to_close:
                    return self._read_to_close()
                return self._read_body()
            if state is SEND_RESPONSE:
                return self._read_head()
            if state is ERROR:
                raise ProtocolError("the connection is already broken")
            return NEED_DATA
        except ProtocolError:
            self.their_state = ERROR
            self._keep_alive = False
            raise

    def _read_head(self) -> Event | Signal:
        if self._pos == len(self._buf) and not self._eof:
            return NEED_DATA
        while True:
            head = self._head()
            if head is None:
                if self._eof:
                    raise ProtocolError("the server closed the connection without answering")
                return NEED_DATA
            (version, code, reason), headers = head
            if version != b"1.1" and version != b"1.0":
                raise ProtocolError(f"unsupported HTTP version {version.decode()}", 505)
            status = int(code)
            if status >= 200:
                break
            if status < 100:
                raise ProtocolError(f"status {status} is not an HTTP status")
            if status == 101:
                raise ProtocolError("the server switched protocols; yard proxies no upgrades")
            # 100 Continue, 103 Early Hints, ...: the real answer follows.
        fields = dict(headers)
        headers = self._framing(headers, fields, version == b"1.1")
        method = self._method
        to_close = False
        if (
            method == b"HEAD"
            or status == 204
            or status == 304
            or (method == b"CONNECT" and status < 300)
        ):
            self._chunked = False
            self._left = 0
        elif not self._chunked and b"content-length" not in fields:
            to_close = True
            self._keep_alive = False
        self._to_close = to_close
        self.their_state = SEND_BODY
        return Response(status, reason or b"", version, headers)

    def _read_to_close(self) -> Event | Signal:
        buf = self._buf
        pos = self._pos
        if pos < len(buf):
            self._pos = len(buf)
            return Data(buf[pos:] if pos else buf)
        if self._eof:
            return self._end_of_message()
        return NEED_DATA


# -- micro-benchmark -----------------------------------------------------------

_BENCH_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:8080\r\n"
    b"content-type: application/json\r\nauthorization: Bearer sk-test\r\n"
    b'content-length: 17\r\n\r\n{"model":"bench"}'
)
_BENCH_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-yard-request-id", b"0123456789abcdef"),
    (b"x-yard-queue-ms", b"0.1"),
]
_BENCH_CHUNK = b'data: {"choices":[{"delta":{"content":"hello"}}]}\n\n'


def _bench(number: int = 20000, repeat: int = 7) -> None:
    """Print µs per request for wire and h11, medians of ``repeat`` rounds."""
    import statistics
    import timeit
    from collections.abc import Callable

    import h11

    def wire_parse() -> None:
        conn = ServerConnection()
        conn.receive_data(_BENCH_REQUEST)
        conn.next_event()
        conn.next_event()
        conn.next_event()

    def h11_parse() -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        conn.receive_data(_BENCH_REQUEST)
        conn.next_event()
        conn.next_event()
        conn.next_event()

    def wire_respond() -> None:
        conn = ServerConnection()
        conn.receive_data(_BENCH_REQUEST)
        conn.next_event()
        conn.response_head(200, _BENCH_HEADERS)
        conn.body(_BENCH_CHUNK)
        conn.end()

    def h11_respond() -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        conn.receive_data(_BENCH_REQUEST)
        conn.next_event()
        conn.send(h11.Response(status_code=200, headers=_BENCH_HEADERS, reason=b"OK", _parsed=True))
        conn.send(h11.Data(data=_BENCH_CHUNK))
        conn.send(h11.EndOfMessage())

    def micros(fn: Callable[[], None]) -> float:
        rounds = timeit.repeat(fn, number=number, repeat=repeat)
        return statistics.median(rounds) / number * 1e6

    print(f"µs per call, median of {repeat} rounds     wire      h11    ratio")
    for what, ours, theirs in [
        ("new connection + parse head/body/end", wire_parse, h11_parse),
        ("the same + response head, chunk, end", wire_respond, h11_respond),
    ]:
        ours_us, theirs_us = micros(ours), micros(theirs)
        print(f"{what} {ours_us:8.2f} {theirs_us:8.2f} {theirs_us / ours_us:7.1f}x")


if __name__ == "__main__":  # pragma: no cover
    _bench()

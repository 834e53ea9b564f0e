"""The records of the Batch API: a file, a batch, a batch line. Frozen, no I/O."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, overload

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
ENDED: tuple[BatchStatus, ...] = ("failed", "completed", "expired", "cancelled")
ENDPOINTS: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/moderations",
)
"""The endpoints a batch may name: OpenAI's, served by whichever backend has
the line's model (yard routes a line exactly as the synchronous request)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FileRecord:
    """One stored file (without its bytes). Times are epochs."""

    seq: int
    id: str
    app: str
    purpose: str
    filename: str
    bytes: int
    created_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchError:
    """One entry of a failed batch's ``errors.data``."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRecord:
    """One batch as stored. Times are epochs; ``expires_at`` is its finish-by.

    priority: its app's default priority when it was created.
    total, completed, failed: its request counts (see
    :meth:`yard.batches.store.BatchStore.counts` while it runs).
    """

    seq: int
    id: str
    app: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    priority: float
    rerun_safe: bool
    status: BatchStatus
    created_at: float
    expires_at: float
    in_progress_at: float | None
    finalizing_at: float | None
    completed_at: float | None
    failed_at: float | None
    expired_at: float | None
    cancelling_at: float | None
    cancelled_at: float | None
    errors: tuple[BatchError, ...]
    output_file_id: str | None
    error_file_id: str | None
    total: int
    completed: int
    failed: int

    @property
    def ended(self) -> bool:
        return self.status in ENDED


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedLine:
    """One valid input line, ready to become a job."""

    line: int
    custom_id: str
    model: str
    backend: str
    url: str
    body: bytes


ParsedRow = tuple[int, str, str, str, str, bytes]
"""A :class:`ParsedLine`'s fields in its order, as a plain tuple."""


class ParsedLines(Sequence[ParsedLine]):
    """A batch's valid lines between their check and their insert: plain
    tuples (:data:`ParsedRow`), handed out as :class:`ParsedLine`.

    Why not the records themselves: 50,000 of them alive at once made
    Python's garbage collector scan the whole heap twice while the batch was
    checked (50-250 ms each, holding the GIL, so yard's event loop stood
    still that long). A tuple of strings, numbers and bytes leaves the
    collector's lists at its first collection and never counts towards a
    full one.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: Sequence[ParsedRow] = ()) -> None:
        self.rows: tuple[ParsedRow, ...] = tuple(rows)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> ParsedLine: ...

    @overload
    def __getitem__(self, index: slice) -> ParsedLines: ...

    def __getitem__(self, index: int | slice) -> ParsedLine | ParsedLines:
        if isinstance(index, slice):
            return ParsedLines(self.rows[index])
        return _parsed(self.rows[index])

    def __iter__(self) -> Iterator[ParsedLine]:
        return map(_parsed, self.rows)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ParsedLines):
            return self.rows == other.rows
        if isinstance(other, (tuple, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ParsedLines({len(self.rows)} lines)"


def _parsed(row: ParsedRow) -> ParsedLine:
    line, custom_id, model, backend, url, body = row
    return ParsedLine(
        line=line, custom_id=custom_id, model=model, backend=backend, url=url, body=body
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LineRecord:
    """One batch line as stored (without its request body).

    idx: its place in submission order. job_id: set once it is a job.
    outcome: ``ok`` or ``error`` once it has ended (its output line is stored).
    """

    batch_id: str
    idx: int
    line: int
    custom_id: str
    model: str
    backend: str
    job_id: str | None
    outcome: str | None

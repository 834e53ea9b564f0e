"""The records of the job service: a job as stored, its request and result,
why it failed, and an app's quota and usage. Frozen, and free of I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
STATUSES: tuple[Status, ...] = ("queued", "running", "succeeded", "failed", "cancelled", "expired")
UNFINISHED: tuple[Status, ...] = ("queued", "running")
Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """What one app may keep stored: jobs that count are queued, running, or
    ended and not yet expired; their bytes are the request body while the
    job has not ended, then the result body."""

    max_jobs: int
    max_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What one app keeps stored now (see :class:`Quota`).

    oldest_finished_at: when the first of its ended jobs ended (it expires
    first, a result TTL later), or None if none has ended.
    """

    jobs: int
    bytes: int
    oldest_finished_at: float | None


class QuotaExceeded(Exception):
    """A new job would take its app past its :class:`Quota`."""

    def __init__(self, usage: Usage, quota: Quota, size: int) -> None:
        super().__init__(f"quota exceeded: {usage} with {size} more bytes, {quota}")
        self.usage = usage
        self.quota = quota
        self.size = size


@dataclass(frozen=True, slots=True, kw_only=True)
class JobError:
    """Why a job failed (or was cancelled): a stable code, a message for
    people, and the HTTP status a synchronous request would have got."""

    code: str
    message: str
    status: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredRequest:
    """The request a job runs, exactly as the client sent it."""

    method: str
    path: str
    query: str
    headers: Headers
    body: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredResult:
    """The backend's whole answer: status, headers and body bytes."""

    status: int
    headers: Headers
    body: bytes

    @property
    def content_type(self) -> str | None:
        for name, value in self.headers:
            if name.lower() == b"content-type":
                return value.decode("latin-1")
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    """One job as stored (without its request and result bytes).

    seq: arrival order across all apps. Times are epochs (seconds).
    start_by: latest start (epoch) or None. not_before: earliest start (epoch)
    or None: it is held until then. queued_s: time from arrival to
    the (latest) dispatch. result_*: what the backend answered, once it has.
    notes: stored fields that could not be read (each is None here instead).
    """

    seq: int
    id: str
    app: str
    model: str
    backend: str
    priority: float
    start_by: float | None
    allow_late: bool
    rerun_safe: bool
    rerun_used: bool
    requeued: bool
    status: Status
    created_at: float | None
    started_at: float | None
    finished_at: float | None
    queued_s: float | None
    error: JobError | None
    result_status: int | None
    result_bytes: int | None
    result_type: str | None
    notes: tuple[str, ...] = ()
    not_before: float | None = None

    @property
    def finished(self) -> bool:
        return self.status not in UNFINISHED

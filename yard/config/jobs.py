"""``[jobs]``: the job service's and the Batch API's settings (:class:`JobsConfig`)
and their reader.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from yard.config.reading import _non_negative, _positive, _Reader
from yard.config.server import ServerConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsConfig:
    """``[jobs]``: the settings of the job service (:mod:`yard.jobs`), which
    takes this record as it is.

    result_ttl_s: how long a finished job keeps its result; then it becomes
        ``expired`` and the bytes are deleted.
    record_ttl_s: how long an expired job is still listed, after that.
    max_result_bytes: the largest backend answer a job stores; a larger one
        fails the job with ``result_too_large``.
    max_request_bytes: the largest request body a job stores (None: the
        server's ``max_body_bytes`` already limits it).
    reap_interval_s: how often expired results are deleted.
    max_wait_s: the longest ``?wait=`` long-poll allowed.
    max_jobs_per_app: how many jobs one app may keep (queued, running, or
        ended and not yet expired); one more is refused with 429.
    max_stored_bytes_per_app: how many bytes one app's jobs may keep (request
        bodies until they end, then result bodies); past it, 507.
    batch_max_file_bytes: the largest file ``POST /v1/files`` takes (413 above).
    batch_max_files_per_app: how many uploaded files one app may keep (429 above).
    batch_max_lines: the most requests one batch input file may hold.
    batch_max_window_s: the longest ``completion_window`` a batch may ask for
        (any whole number of hours from ``1h`` up to this).
    batch_queued_lines: the most lines of one batch in the queue at once; the
        rest wait on disk and follow as these end.
    batch_priority_drop: batch lines run this far below their app's default
        priority while their batch is on schedule (at the default once behind).
    """

    result_ttl_s: float = 24 * 3600.0
    record_ttl_s: float = 7 * 24 * 3600.0
    max_result_bytes: int = 256 * 2**20
    max_request_bytes: int | None = None
    reap_interval_s: float = 60.0
    max_wait_s: float = 300.0
    max_jobs_per_app: int = 1000
    max_stored_bytes_per_app: int = 2 * 2**30
    batch_max_file_bytes: int = 50 * 2**20
    batch_max_files_per_app: int = 500
    batch_max_lines: int = 50_000
    batch_max_window_s: float = 7 * 24 * 3600.0
    batch_queued_lines: int = 64
    batch_priority_drop: float = 10.0


JOBS_KEYS = tuple(f.name for f in dataclasses.fields(JobsConfig))


def _jobs(r: _Reader, data: dict[str, Any], server: ServerConfig) -> JobsConfig:
    r.known(data, "jobs", JOBS_KEYS)
    defaults = JobsConfig()
    max_result = r.size(data, "jobs", "max_result_bytes", defaults.max_result_bytes)
    if "max_result_bytes" in data and max_result == 0:
        r.error("jobs.max_result_bytes", "must be greater than 0")
    max_request: int | None = None
    if "max_request_bytes" in data:
        max_request = r.size(data, "jobs", "max_request_bytes", 0)
        if max_request == 0:
            r.error("jobs.max_request_bytes", "must be greater than 0 (or left out)")
            max_request = None
        elif max_request > server.max_body_bytes:
            r.error(
                "jobs.max_request_bytes",
                f"{max_request} is above server.max_body_bytes ({server.max_body_bytes}): "
                "larger requests are refused (413) before they become jobs; lower it, "
                "raise server.max_body_bytes, or leave it out",
            )
            max_request = None
    stored = r.size(data, "jobs", "max_stored_bytes_per_app", defaults.max_stored_bytes_per_app)
    if stored == 0:
        r.error("jobs.max_stored_bytes_per_app", "must be greater than 0")
        stored = defaults.max_stored_bytes_per_app
    return JobsConfig(
        result_ttl_s=r.get(data, "jobs", "result_ttl_s", float, defaults.result_ttl_s, _positive),
        record_ttl_s=r.get(
            data, "jobs", "record_ttl_s", float, defaults.record_ttl_s, _non_negative
        ),
        max_result_bytes=max_result,
        max_request_bytes=max_request,
        reap_interval_s=r.get(
            data, "jobs", "reap_interval_s", float, defaults.reap_interval_s, _positive
        ),
        max_wait_s=r.get(data, "jobs", "max_wait_s", float, defaults.max_wait_s, _non_negative),
        max_jobs_per_app=r.get(
            data, "jobs", "max_jobs_per_app", int, defaults.max_jobs_per_app, _positive
        ),
        max_stored_bytes_per_app=stored,
        **_batch_keys(r, data, server, defaults),
    )


def _batch_keys(
    r: _Reader, data: dict[str, Any], server: ServerConfig, defaults: JobsConfig
) -> dict[str, Any]:
    """The ``[jobs] batch_*`` keys (the Batch API, :mod:`yard.batches`)."""
    file_bytes = r.size(data, "jobs", "batch_max_file_bytes", defaults.batch_max_file_bytes)
    if file_bytes == 0:
        r.error("jobs.batch_max_file_bytes", "must be greater than 0")
        file_bytes = defaults.batch_max_file_bytes
    elif "batch_max_file_bytes" in data and file_bytes > server.max_body_bytes:
        r.error(
            "jobs.batch_max_file_bytes",
            f"{file_bytes} is above server.max_body_bytes ({server.max_body_bytes}): a larger "
            "upload is refused (413) before it is read; lower it or raise server.max_body_bytes",
        )
        file_bytes = defaults.batch_max_file_bytes
    window = r.get(
        data, "jobs", "batch_max_window_s", float, defaults.batch_max_window_s, _positive
    )
    if window < 3600.0:
        r.error("jobs.batch_max_window_s", f"must be at least 3600 (one hour), got {window:g}")
        window = defaults.batch_max_window_s
    return {
        "batch_max_file_bytes": file_bytes,
        "batch_max_files_per_app": r.get(
            data,
            "jobs",
            "batch_max_files_per_app",
            int,
            defaults.batch_max_files_per_app,
            _positive,
        ),
        "batch_max_lines": r.get(
            data, "jobs", "batch_max_lines", int, defaults.batch_max_lines, _positive
        ),
        "batch_max_window_s": window,
        "batch_queued_lines": r.get(
            data, "jobs", "batch_queued_lines", int, defaults.batch_queued_lines, _positive
        ),
        "batch_priority_drop": r.get(
            data,
            "jobs",
            "batch_priority_drop",
            float,
            defaults.batch_priority_drop,
            _non_negative,
        ),
    }

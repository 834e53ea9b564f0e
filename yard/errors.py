"""The one error type for a request yard refuses or ends without serving it.

A leaf module (the standard library only), so that every layer can raise and
catch the same type: the engine (the core refused the request, its deadline
passed, its backend failed, yard is shutting down), the HTTP layer (a missing
key, a malformed header, a body too large) and the job service (a quota, a
job too large). The HTTP layer answers it in the OpenAI error shape
(``yard.h1.errors.error_body``).
"""

from __future__ import annotations

__all__ = ["Rejected"]


class Rejected(Exception):
    """A request refused or ended without being served.

    status: the HTTP status to answer with. code: a stable error code
    (``model_not_found``, ``deadline_missed``, ``too_many_jobs``, ...).
    message: what happened and what to do, for people. retry_after_s: sent
    as ``Retry-After`` (whole seconds, rounded up), mostly with 429 and 503.
    param: the request's field at fault (OpenAI's ``param``), if one is.

    Both ``Rejected(400, "invalid_json", "...")`` and keywords work.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retry_after_s: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.param = param

    def __repr__(self) -> str:
        return f"Rejected(status={self.status}, code={self.code!r}, message={self.message!r})"

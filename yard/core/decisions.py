"""Decisions: everything the core asks the engine to do.

Every decision carries ``reason``: one sentence a person can read ("gpu0 needs
14.2 GiB for llm-big; stopping idle tts (least demand: fewest recent requests
for its reload cost; reloads in 8.0 s)"). The same
reasons answer "why is my request still waiting?" in the API and dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from yard.core.spec import Profile


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """Base of every decision."""

    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StartBackend(Decision):
    """Start the backend's process, placed on ``gpus`` (empty: host only).

    measure: this is a first load, alone on its devices: the engine samples
        memory through start-up and warm-up and reports a ``ProfileMeasured``.
    context, parallel: the context size and slot count chosen within the
        backend's ranges (None: it has no such range).
    """

    backend: str
    gpus: tuple[str, ...] = ()
    measure: bool = False
    context: int | None = None
    parallel: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StopBackend(Decision):
    """Stop the backend (SIGTERM to its group, SIGKILL after a grace period),
    then report ``BackendStopped`` once its memory is free."""

    backend: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch(Decision):
    """Send the request to the backend now; it holds one of its slots."""

    request_id: str
    backend: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject(Decision):
    """End the request with an error; it leaves the core for good.

    status: the HTTP status (404, 413, 503, 502, 504...).
    code: a stable error code (``does_not_fit``, ``deadline_missed``,
        ``deadline_infeasible``, ``queue_full``, ``backend_failed``,
        ``model_not_found``...).
    message: what happened and what to do, for the client.
    retry_after_s: for 503s, when trying again makes sense.
    """

    request_id: str
    status: int
    code: str
    message: str
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Requeue(Decision):
    """The request's backend died of an out-of-memory that yard caused; the
    request is back in the queue at its original place (once, never twice).
    Whoever holds it waits for the next ``Dispatch``."""

    request_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag(Decision):
    """Informational, changes nothing: a deadline that will be missed but was
    accepted because the request allows lateness; a backend using more memory
    than its profile; a start that is waiting for memory to be freed."""

    request_id: str | None = None
    backend: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileRaised(Flag):
    """The core raised a backend's profile after an out-of-memory it caused
    itself (the profile proved too small). ``profile`` is the new figure,
    margin not applied; the engine may persist it through its ProfileStore.
    An engine that treats it as a plain :class:`Flag` loses nothing else."""

    profile: Profile


@dataclass(frozen=True, slots=True, kw_only=True)
class AnnouncementEnded(Flag):
    """An announcement is over, once: ``used`` (its count of requests came),
    ``expired`` (its window closed first) or ``withdrawn`` (by its app).
    ``used`` counts the requests matched to it. An engine that treats it as a
    plain :class:`Flag` loses nothing else."""

    announcement_id: str
    app: str
    outcome: Literal["used", "expired", "withdrawn"]
    used: int = 0

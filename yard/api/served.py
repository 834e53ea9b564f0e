"""What the jobs, Batch and announcement APIs share beyond a request's body:
what each was mounted with, and the shape of one page of a list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from yard.api.keys import KeyCheck

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Served(Generic[S]):
    """What an API's ``register`` mounted it with, kept in ``app.extensions``
    under the API's key: its service (None: this yard runs without it, and
    every call answers 501) and the key check."""

    service: S | None
    keys: KeyCheck


def page(data: list[dict[str, object]], *, has_more: bool) -> dict[str, object]:
    """One page of a list in OpenAI's shape (``data``: the items, each with its
    ``id``); the next page starts ``after`` its ``last_id``."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }

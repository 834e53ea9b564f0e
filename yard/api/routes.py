"""Answers for a ``/v1`` request yard cannot route, that help the caller
find the right one: a model name close to one it may use ("did you mean"),
and a path that is a near miss of an OpenAI path (``/v1/chat/completion``).

Rules it keeps:

- A suggestion names only a model the app may use: the models outside its
  scope do not exist for it, in suggestions too.
- Only a near miss of a path OpenAI defines is refused (a path within a few
  characters of one, such as a missing ``s``); any other ``/v1`` path still
  goes to the backend of its model, as before, for servers with paths of
  their own.
"""

from __future__ import annotations

import difflib

from yard.config import AppConfig, Config
from yard.errors import Rejected

OPENAI_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/images/generations",
        "/v1/images/edits",
        "/v1/images/variations",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/moderations",
        "/v1/responses",
        "/v1/rerank",
        "/v1/reranking",
        "/v1/models",
    }
)
"""The OpenAI paths yard routes by model, and the rerank paths of llama.cpp."""


def unknown_model(config: Config, app: AppConfig, model: str) -> Rejected:
    """The 404 ``model_not_found`` for ``model``, with the closest name the
    app may use when one is close."""
    shown = repr(model) if len(model) <= 200 else repr(model[:200]) + "..."
    usable = sorted({name for name, _ in config.models() if app.may_use(name)})
    close = difflib.get_close_matches(model[:200], usable, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return Rejected(
        404,
        "model_not_found",
        f"the model {shown} does not exist in this yard; {hint}GET /v1/models lists them",
    )


def mistyped_path(path: str) -> Rejected | None:
    """A 404 ``path_not_found`` if ``path`` is a near miss of an OpenAI path
    (and not one itself), else None."""
    if path in OPENAI_PATHS or len(path) > 64:
        return None
    close = difflib.get_close_matches(path, OPENAI_PATHS, n=1, cutoff=0.9)
    if not close:
        return None
    return Rejected(
        404,
        "path_not_found",
        f"yard serves no {path}: did you mean {close[0]}? (the OpenAI paths are "
        "/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/images/generations, "
        "/v1/audio/speech, ...)",
    )

"""``yard models``: the rows it prints from a status document."""

from __future__ import annotations

from yard.models_cli import format_models, model_rows

GIB = 2**30


def test_models_show_measured_or_estimated_memory_and_the_context_range() -> None:
    status = {
        "backends": [
            {
                "name": "chat",
                "models": ["chat", "chat-alias"],
                "state": "ready",
                "profile": {"gpu_bytes": 4 * GIB, "host_bytes": GIB // 2, "load_s": 3.0},
                "estimate": None,
                "context_range": [2048, 32768],
                "context": 16384,
            },
            {
                "name": "new",
                "models": ["new"],
                "state": "stopped",
                "profile": None,
                "estimate": {"gpu_bytes": 0, "host_bytes": 2 * GIB},
                "context_range": [4096, 4096],
                "context": None,
            },
            {"name": "plain", "models": [], "state": "stopped", "profile": None},
        ]
    }
    assert format_models(model_rows(status)).splitlines() == [
        "MODEL       BACKEND  STATE    MEMORY                                 CONTEXT",
        "chat        chat     ready    4.0 GiB GPU + 0.5 GiB host (measured)  "
        "2048-32768 (now 16384)",
        "chat-alias  chat     ready    4.0 GiB GPU + 0.5 GiB host (measured)  "
        "2048-32768 (now 16384)",
        "new         new      stopped  2.0 GiB host (estimated)               4096",
        "plain       plain    stopped  unknown until loaded                   -",
    ]

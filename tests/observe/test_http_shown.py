"""``/metrics`` shows what the HTTP server's connection limits did (issue 10)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from yard.h1.server import ServerStatistics
from yard.observe.metrics import HttpCollector


def _scrape(stats: ServerStatistics | None) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HttpCollector(lambda: stats))
    return generate_latest(registry).decode()


def test_each_limit_is_counted_under_its_own_reason() -> None:
    text = _scrape(
        ServerStatistics(
            open_connections=12,
            waiting_connections=5,
            max_connections=1000,
            evicted=3,
            refused=2,
            head_timeouts=7,
            idle_closed=11,
            body_timeouts=1,
            send_timeouts=4,
        )
    )
    lines = set(text.splitlines())
    assert 'yard_http_connections{state="open"} 12.0' in lines
    assert 'yard_http_connections{state="waiting"} 5.0' in lines
    assert "yard_http_max_connections 1000.0" in lines
    for reason, count in (
        ("evicted", 3),
        ("refused", 2),
        ("head_timeout", 7),
        ("idle", 11),
        ("body_timeout", 1),
        ("send_timeout", 4),
    ):
        assert f'yard_http_connections_closed_total{{reason="{reason}"}} {count}.0' in lines


def test_nothing_is_shown_before_the_server_serves() -> None:
    assert "yard_http" not in _scrape(None)

"""news-llm as two instances on the two-GPU announced radio day (issue 12's last target)."""

from __future__ import annotations

from sim import scenarios
from sim.runner import run
from sim.scenarios_ahead import radio_day_announced
from sim.targets_ahead import instances_floor, one_instance_floor


def test_two_gpus_run_two_news_instances_and_one_gpu_one() -> None:
    two = [m for m in radio_day_announced(2).models if m.name.startswith("news-llm")]
    assert [(m.name, m.instances, m.instance_of) for m in two] == [
        ("news-llm", 2, None),
        ("news-llm@2", 2, "news-llm"),
    ]
    one = [m.name for m in radio_day_announced(1).models]
    assert one == [m.name for m in scenarios.radio_day(1).models]


def test_the_second_instance_loads_on_the_other_gpu_while_the_first_is_busy() -> None:
    result = run(radio_day_announced(2, hours=3.0), "yard", seed=3, keep_log=True)
    assert result.log is not None and not result.ooms
    placed = {backend: gpus for _, backend, gpus in result.launches}
    assert placed["news-llm"] != placed["news-llm@2"]
    served = {backend for _, backend in result.dispatch_order}
    assert {"news-llm", "news-llm@2"} <= served
    # One instance never makes room for the other.
    assert not [
        line
        for line in result.log
        if "StopBackend" in line and "stopping news-llm" in line and "room for news-llm" in line
    ]
    news = [r for r in result.records if r.arrival.backend == "news-llm"]
    assert news and all(r.outcome == "ok" for r in news)


def test_the_baselines_run_the_plain_day_with_one_news_instance() -> None:
    # They cannot take announcements, and llama-swap, Ollama and the LRU policy
    # have no way to run a model twice: the announced day is the plain day to them.
    plain = run(scenarios.radio_day(2, hours=1.0), "lru", seed=3)
    announced = run(radio_day_announced(2, hours=1.0), "lru", seed=3)
    assert announced.log_digest == plain.log_digest
    assert [r.arrival for r in announced.records] == [r.arrival for r in plain.records]


def test_the_queueing_floor_with_two_instances() -> None:
    assert round(one_instance_floor(2024), 1) == 98.7
    assert round(instances_floor(2024, 1), 1) == 98.7
    assert round(instances_floor(2024, 2), 1) == 17.7

from __future__ import annotations

import json

import pytest

from ddctl.config.train import ClusterConfig, Outage, TrainConfig, from_json, parse_outage, to_json
from ddctl_agents.errors import ConfigError
from ddctl_agents.train.config import RunBudget


def test_outage_syntax() -> None:
    assert parse_outage("1@30+20") == Outage(learner=1, at=30.0, duration=20.0)
    assert parse_outage("0@12.5s") == Outage(learner=0, at=12.5, duration=None)
    with pytest.raises(ConfigError, match="LEARNER@SECONDS"):
        parse_outage("one@thirty")


def test_config_survives_a_json_round_trip_exactly() -> None:
    config = TrainConfig(
        budget=RunBudget(tokens=5000, learners=3),
        cluster=ClusterConfig(speeds=(1.0, 0.5, 2.0), outages=(Outage(learner=2, at=3.0, duration=4.0),)),
    )
    assert from_json(TrainConfig, json.loads(json.dumps(to_json(config)))) == config


def test_json_with_an_unknown_key_is_refused() -> None:
    data = to_json(TrainConfig())
    data["cluster"]["warp_speed"] = 9
    with pytest.raises(ConfigError, match="cluster.warp_speed: unknown key"):
        from_json(TrainConfig, data)


def test_json_values_are_validated_like_flags() -> None:
    data = to_json(TrainConfig())
    data["budget"]["learners"] = 0
    with pytest.raises(ConfigError, match="learners must be in"):
        from_json(TrainConfig, data)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cluster": ClusterConfig(speeds=(1.0,))}, "one speed per learner"),
        ({"fragmentation": "random"}, "fragmentation must be one of"),
        ({"threads": 0}, r"threads must be in \[1, 1024\], got 0"),
    ],
)
def test_inconsistent_configs_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speeds": (0.0,)}, "speeds"),
        ({"jitter": 0.7}, "jitter"),
        ({"link_mbps": 0}, "link_mbps"),
        ({"latency_ms": -1}, "latency"),
    ],
)
def test_cluster_knobs_are_range_checked(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClusterConfig(**kwargs)

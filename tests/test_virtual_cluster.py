from __future__ import annotations

import pytest

from builders import small_run
from ddctl.config.train import ClusterConfig, Outage
from ddctl.local.virtual_cluster import VirtualCluster
from ddctl_agents.train.assembly import Assembly


def run(**kw: object) -> VirtualCluster:
    cluster = VirtualCluster(Assembly.build(small_run(**kw)))  # type: ignore[arg-type]
    cluster.run()
    return cluster


@pytest.mark.slow
def test_grace_admits_more_learners_per_round_than_k1_alone() -> None:
    speeds = ClusterConfig(jitter=0.2)  # near misses: the same fragment lands within a step of each other
    with_grace = run(tokens=30_000, learners=3, grace=True, cluster=speeds)
    without = run(tokens=30_000, learners=3, grace=False, cluster=speeds)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(with_grace.stats.admitted) > mean(without.stats.admitted)
    assert "grace_off" in without.stats.causes
    assert "grace_off" not in with_grace.stats.causes


def test_a_learner_killed_mid_upload_is_not_merged_and_the_rest_keep_merging() -> None:
    # at 0.4 Mbit/s bootstrap takes ~40 s and every upload longer than a step, so a failure at 55 s lands mid-upload
    slow = ClusterConfig(link_mbps=0.4, outages=(Outage(learner=1, at=55.0, duration=None),))
    cluster = run(tokens=24_000, learners=3, cluster=slow)
    stats = cluster.stats
    assert stats.lost_in_flight > 0
    rounds_after = [t for t, _ in stats.round_times if t > 55.0 + 3.0]
    assert rounds_after, "rounds kept closing after the learner died"
    assert "L1" not in cluster.syncer.live


def test_heartbeats_and_transfers_feed_the_link_estimates() -> None:
    cluster = run(tokens=8_000, learners=2, cluster=ClusterConfig(link_mbps=8.0, latency_ms=20.0))
    links = cluster.syncer.links["L0"]
    assert links.up.bytes_per_s is not None and 0.5e6 < links.up.bytes_per_s <= 1e6  # 8 Mbit/s = 1 MB/s
    step_time = links.pace.step_time
    assert step_time is not None and step_time != 1.0  # measured from jittered steps, not the nominal value
    assert step_time == pytest.approx(1.0, rel=0.1)

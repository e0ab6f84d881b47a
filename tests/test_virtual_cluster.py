from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from builders import small_run
from ddctl.config.train import ClusterConfig, Outage
from ddctl.local.virtual_cluster import VirtualCluster
from ddctl_agents.core.effects import Effect, Record
from ddctl_agents.core.messages import Update
from ddctl_agents.core.quorum import Timing
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
    assert "L1" not in cluster.shards.cores[0].live


def test_heartbeats_and_transfers_feed_the_link_estimates() -> None:
    cluster = run(tokens=8_000, learners=2, cluster=ClusterConfig(link_mbps=8.0, latency_ms=20.0))
    links = cluster.shards.cores[0].links["L0"]
    assert links.up.bytes_per_s is not None and 0.5e6 < links.up.bytes_per_s <= 1e6  # 8 Mbit/s = 1 MB/s
    step_time = links.pace.step_time
    assert step_time is not None and step_time != 1.0  # measured from jittered steps, not the nominal value
    assert step_time == pytest.approx(1.0, rel=0.1)


@dataclass
class Observed:
    """What a run's syncer saw: every update's arrival, every forecast it made, every round it closed."""

    arrivals: list[tuple[float, int, str]] = field(default_factory=list)
    forecasts: list[tuple[float, int, str, float]] = field(default_factory=list)
    rounds: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    drained_at: float | None = None

    def forecast_errors(self) -> list[float]:
        """Each forecast against the arrival it forecast: that learner's next update for that fragment."""
        errors = []
        for now, p, who, eta in self.forecasts:
            landed = [t for t, q, m in self.arrivals if q == p and m == who and t >= now]
            if landed:
                errors.append(landed[0] - eta)
        return errors


def observed_run(**kw: object) -> tuple[VirtualCluster, Observed]:
    cluster = VirtualCluster(Assembly.build(small_run(**kw)))  # type: ignore[arg-type]
    seen, syncer = Observed(), cluster.shards.cores[0]
    timing, receive, apply, drain = syncer._timing, syncer.receive, cluster._apply, cluster._drain

    def spy_timing(now: float, p: int) -> Timing:
        t = timing(now, p)
        seen.forecasts += [(now, p, m, eta) for m, eta in t.forecasts.items()]
        return t

    def spy_receive(now: float, update: Update, nbytes: int) -> Any:
        seen.arrivals.append((now, update.fragment, update.learner))
        return receive(now, update, nbytes)

    def spy_apply(effects: list[Effect], shard: int) -> None:
        seen.rounds += [(cluster.now, e.entry) for e in effects if isinstance(e, Record) and e.entry["type"] == "round"]
        apply(effects, shard)

    def spy_drain() -> None:
        seen.drained_at = cluster.now
        drain()

    syncer._timing, syncer.receive, cluster._apply, cluster._drain = spy_timing, spy_receive, spy_apply, spy_drain  # type: ignore[method-assign]
    cluster.run()
    return cluster, seen


def fresh(entry: dict[str, Any]) -> set[str]:
    return {a["learner"] for a in entry["admitted"] if not a["late"]}


def test_equal_speed_learners_all_make_every_round_when_their_arrivals_fit_the_slack() -> None:
    # 15% step-time jitter spreads one round's uploads by up to 0.8 step times, inside the slack (0.8 x 2
    # steps); forecasts that counted latency twice, and a window capped at one step, shut learners out of
    # 8 of these 18 rounds
    _, seen = observed_run(tokens=60_000, learners=4, cluster=ClusterConfig(jitter=0.15))
    training = [entry for t, entry in seen.rounds if entry["cause"] != "final_drain"]
    assert len(training) >= 12
    assert all(entry["cause"] == "all_arrived" and len(fresh(entry)) == 4 for entry in training), training
    spreads = [max(ts) - min(ts) for ts in _round_arrivals(seen).values() if len(ts) == 4]
    assert max(spreads) > 0.5  # the learners did not arrive together


def _round_arrivals(seen: Observed) -> dict[tuple[int, int], list[float]]:
    """Arrival times by (fragment, how many rounds of it had closed before): one list per round."""
    closes = [(t, entry["fragment"]) for t, entry in seen.rounds]
    out: dict[tuple[int, int], list[float]] = {}
    for t, p, _ in seen.arrivals:
        out.setdefault((p, sum(1 for c, q in closes if q == p and c < t)), []).append(t)
    return out


def test_the_arrival_forecast_of_a_shaped_link_is_the_arrival() -> None:
    # no jitter: a forecast from step pace and the measured uplink can be exact, and was 2 x latency late
    shaped = ClusterConfig(jitter=0.0, speeds=(1.0, 0.9), link_mbps=20.0, latency_ms=80.0)
    _, seen = observed_run(tokens=40_000, learners=2, cluster=shaped)
    errors = sorted(seen.forecast_errors(), key=abs)
    assert len(errors) >= 10
    assert abs(errors[len(errors) // 2]) < 1e-3, errors  # the median forecast is the arrival
    assert abs(errors[-1]) < 0.08, errors  # none is off by the latency (pace extrapolated over steps: ~0.06)


def test_the_first_round_of_each_fragment_waits_for_every_learner() -> None:
    # before any upload is measured there is no forecast; a learner without one may well be coming
    _, seen = observed_run(tokens=60_000, learners=4)
    first: dict[int, dict[str, Any]] = {}
    for _, entry in seen.rounds:
        first.setdefault(entry["fragment"], entry)
    assert len(first) == 4
    assert all(fresh(entry) == {"L0", "L1", "L2", "L3"} for entry in first.values()), first


def test_the_final_flush_closes_one_round_per_fragment_with_every_flush_in_it() -> None:
    cluster, seen = observed_run(tokens=60_000, learners=4)
    assert seen.drained_at is not None
    final = [entry for t, entry in seen.rounds if t >= seen.drained_at]
    assert sorted(entry["fragment"] for entry in final) == [0, 1, 2, 3]  # one round each, no out-of-date second step
    assert all(entry["cause"] == "final_drain" for entry in final)
    flushed = {(p, m) for t, p, m in seen.arrivals if t >= seen.drained_at}
    admitted = {(entry["fragment"], a["learner"]) for entry in final for a in entry["admitted"]}
    assert flushed and flushed <= admitted
    assert cluster.stats.learner_ledger.trained == cluster.stats.learner_ledger.sent + cluster.stats.learner_ledger.overwritten

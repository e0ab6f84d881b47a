"""The syncer's port across clouds: opened to exactly the run's live learners, following replacements and partitions.

The controller is run against the fake provider registered as a cloud (its instances have addresses, so
its syncer has a port to open), and the plan's egress per cloud pair is checked against the traffic it
claims to price.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from ddctl import providers
from ddctl.config import synchronizer
from ddctl.config.regions import job_config, parse_regions
from ddctl.control import admission
from ddctl.control.controller import Controller
from ddctl.control.quotes import GB, cloud_pairs, egress_bytes, sync_traffic
from ddctl.control.state import InstanceRecord, State
from ddctl.providers.aws import prices as aws_prices
from ddctl.providers.base import Instance, InstanceSpec
from ddctl.providers.fake import FakeProvider
from ddctl.providers.gcp import prices as gcp_prices

RUN = "r"


def _instance(name: str, address: str, alive: bool = True) -> Instance:
    return Instance(name=name, provider_id=f"id-{name}", run=RUN, alive=alive, address=address)


def test_only_live_learners_with_an_address_outside_a_partition_are_wanted() -> None:
    listed = {
        "L0": _instance("L0", "100.100.0.5"),
        "L1": _instance("L1", "100.100.192.7"),
        "L2": _instance("L2", "100.100.0.9", alive=False),  # ended: its rule goes
        "L3": _instance("L3", ""),  # not up yet: nothing to open
        "syncer": _instance("syncer", "100.100.0.2"),  # not a learner
    }
    regions = {"L0": "virginia", "L1": "iowa", "L2": "iowa", "L3": "iowa"}
    assert admission.wanted(listed, regions, set()) == {"L0": "100.100.0.5", "L1": "100.100.192.7"}
    assert admission.wanted(listed, regions, {"iowa"}) == {"L0": "100.100.0.5"}


def test_a_partition_is_remembered_per_run_until_healed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path))
    assert admission.partitioned(RUN) == set()
    admission.set_partitioned(RUN, "iowa", True)
    admission.set_partitioned(RUN, "virginia", True)
    admission.set_partitioned(RUN, "iowa", False)
    assert admission.partitioned(RUN) == {"virginia"} and admission.partitioned("other") == set()


@pytest.fixture
def cloudy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[State, FakeProvider, Controller]:
    """A run whose syncer and learners live on the fake provider, registered as a cloud."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(providers.KINDS, "fake", dataclasses.replace(providers.KINDS["fake"], local=False))
    state = State(tmp_path / "state.sqlite3")
    state.create_run(RUN, "regions.yaml", str(tmp_path / "job"), {})
    state.set_run_state(RUN, "training")
    fake = FakeProvider()
    placements = [{"provider": "fake", "cloud_region": "eu", "zone": "eu-a"}]
    for name, role, region in (("syncer", "syncer", "eu"), ("L0", "learner", "eu"), ("L1", "learner", "us")):
        spec = InstanceSpec(run=RUN, name=name, region=region, role=role, argv=("agent",), log=tmp_path / f"{name}.log")
        started = fake.create(spec)
        record = InstanceRecord(RUN, name, region, "fake", role, "running", started.provider_id, time.time(),
                                {"spec": spec.to_json(), "placements": placements})  # fmt: skip
        state.put_instance(record)
    fake.calls.clear()
    return state, fake, Controller(RUN, state, owners={"fake": fake})


def test_the_controller_opens_the_port_to_the_learners_and_follows_a_replacement(
    cloudy: tuple[State, FakeProvider, Controller],
) -> None:
    state, fake, controller = cloudy
    controller.once(now=0.0)
    addresses = {i.name: i.address for i in fake.list_run(RUN)}
    assert fake.admitted[RUN] == {"L0": addresses["L0"], "L1": addresses["L1"]}
    controller.once(now=1.0)
    assert [c for c in fake.calls if c[0] == "admit"] == [("admit", "L0,L1")]  # unchanged: not sent again
    fake.end(RUN, "L0")  # preempted: replaced at a new address
    controller.once(now=2.0)
    fresh = {i.name: i.address for i in fake.list_run(RUN)}
    assert fresh["L0"] != addresses["L0"]
    assert fake.admitted[RUN] == {"L0": fresh["L0"], "L1": addresses["L1"]}  # the old address is closed


def test_every_cloud_running_a_shard_has_its_port_follow_the_learners(
    cloudy: tuple[State, FakeProvider, Controller], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sharded run across two clouds: S1 on the other cloud's VM; its firewall follows the same learners."""
    state, fake, _ = cloudy
    other = FakeProvider(kind="other")
    monkeypatch.setitem(providers.KINDS, "other", providers.KINDS["fake"])
    spec = InstanceSpec(run=RUN, name="syncer-s1", region="asia", role="syncer", argv=("agent",), log=tmp_path / "s1.log")
    made = other.create(spec)
    placements = [{"provider": "other", "cloud_region": "asia", "zone": "asia-a"}]
    state.put_instance(InstanceRecord(RUN, "syncer-s1", "asia", "other", "syncer", "running", made.provider_id, time.time(),
                                      {"spec": spec.to_json(), "placements": placements}))  # fmt: skip
    controller = Controller(RUN, state, owners={"fake": fake, "other": other})
    controller.once(now=0.0)
    addresses = {i.name: i.address for i in fake.list_run(RUN) if i.name.startswith("L")}
    assert fake.admitted[RUN] == other.admitted[RUN] == addresses
    fake.end(RUN, "L1")  # replaced at a new address: both clouds close the old one and open the new
    controller.once(now=1.0)
    fresh = {i.name: i.address for i in fake.list_run(RUN) if i.name.startswith("L")}
    assert fresh["L1"] != addresses["L1"] and fake.admitted[RUN] == other.admitted[RUN] == fresh


def test_a_partitioned_region_is_left_out_until_it_heals(cloudy: tuple[State, FakeProvider, Controller]) -> None:
    state, fake, controller = cloudy
    controller.once(now=0.0)
    admission.set_partitioned(RUN, "us", True)
    controller.once(now=1.0)
    assert set(fake.admitted[RUN]) == {"L0"}
    admission.set_partitioned(RUN, "us", False)
    controller.once(now=2.0)
    assert set(fake.admitted[RUN]) == {"L0", "L1"}


def test_the_plans_egress_per_cloud_pair_is_the_traffic_at_the_senders_rate(tmp_path: Path) -> None:
    rf = parse_regions(
        {
            "syncer": "virginia",
            "training": {"preset": "tiny", "fragments": 2, "inner_steps": 8},
            "regions": [
                {"name": "virginia", "provider": "aws", "cloud_region": "us-east-1", "learners": 2},
                {"name": "iowa", "provider": "gcp", "cloud_region": "us-central1", "learners": 2},
                {"name": "tokyo", "provider": "gcp", "cloud_region": "asia-northeast1", "learners": 1},
                {"name": "ohio", "provider": "aws", "cloud_region": "us-east-2", "learners": 1},
                {"name": "laptop", "provider": "process", "learners": 1},
            ],
        },
        tmp_path / "r.yaml",
    )
    kinds = {r.name: r.provider for r in rf.regions}
    traffic = sync_traffic(job_config(rf))
    up, down = (b * traffic.syncs_per_hour / GB for b in (traffic.up_bytes, traffic.down_bytes))
    pairs = {(p["from"], p["to"]): p for p in cloud_pairs(rf, kinds, traffic)}
    assert set(pairs) == {("aws", "gcp"), ("gcp", "aws"), ("aws", "aws"), ("aws", "process"), ("process", "aws")}
    assert pairs["gcp", "aws"]["gb_per_hour"] == pytest.approx(3 * up, abs=1e-3)
    gcp_rate = 2 * up * gcp_prices.egress_per_gb("internet", "us-central1") + up * gcp_prices.egress_per_gb(
        "internet", "asia-northeast1"
    )
    assert pairs["gcp", "aws"]["dollars_per_hour"] == pytest.approx(gcp_rate, abs=1e-3)
    assert pairs["aws", "gcp"]["gb_per_hour"] == pytest.approx(3 * down, abs=1e-3)
    assert pairs["aws", "gcp"]["dollars_per_hour"] == pytest.approx(
        3 * down * aws_prices.egress_per_gb("internet", "us-east-1"), abs=1e-3
    )
    assert pairs["aws", "aws"]["gb_per_hour"] == pytest.approx(up + down, abs=1e-3)  # ohio: inter-region, both ways
    assert pairs["aws", "aws"]["dollars_per_hour"] == pytest.approx((up + down) * 0.02, abs=1e-3)
    assert pairs["process", "aws"]["dollars_per_hour"] == 0.0  # this machine's uploads cost nothing here
    assert pairs["aws", "process"]["dollars_per_hour"] == pytest.approx(
        down * aws_prices.egress_per_gb("internet", "us-east-1"), abs=1e-3
    )
    assert json.dumps(list(pairs.values()))  # plain data, as --json prints it


def test_chaos_partition_shuts_a_cloud_regions_learners_out_and_lets_them_back(
    cloudy: tuple[State, FakeProvider, Controller], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddctl.control import chaos

    state, fake, _ = cloudy
    monkeypatch.setattr(providers, "get", lambda kind: fake)
    during: list[set[str]] = []
    result = chaos.partition(RUN, state, "us", 0.05, on_cut=lambda: during.append(set(fake.admitted[RUN])))
    assert during == [{"L0"}]  # while cut: only the other region's learner
    assert set(fake.admitted[RUN]) == {"L0", "L1"} and admission.partitioned(RUN) == set()
    assert result["region"] == "us" and result["seconds"] >= 0.05


def test_a_sharded_plans_egress_follows_each_shards_fragments_and_each_regions_cadence(tmp_path: Path) -> None:
    """Each learner region's bytes go to the shard owning each fragment, at the cadence ``up`` runs it at."""
    rf = parse_regions(
        {
            "synchronizer": {"shards": 2, "regions": ["virginia", "iowa"]},
            "training": {"preset": "tiny", "fragments": 4, "inner_steps": 8},
            "regions": [
                {"name": "virginia", "provider": "aws", "cloud_region": "us-east-1", "learners": 1},
                {"name": "iowa", "provider": "gcp", "cloud_region": "us-central1", "learners": 1},
                {"name": "tokyo", "provider": "gcp", "cloud_region": "asia-northeast1", "learners": 1, "cadence": 2},
            ],
        },
        tmp_path / "r.yaml",
    )
    plan = synchronizer.shard_plan(rf, job_config(rf))
    share = {s.site: len(s.fragments) / 4 for s in plan.shards}
    assert sorted(share) == ["iowa", "virginia"] and plan.cadence["tokyo"] == 2
    kinds = {r.name: r.provider for r in rf.regions}
    traffic = sync_traffic(job_config(rf))
    up, down = (b * traffic.syncs_per_hour for b in (traffic.up_bytes, traffic.down_bytes))
    out = egress_bytes(rf, kinds, traffic)
    assert out["virginia"] == pytest.approx({"internet": share["iowa"] * up + share["virginia"] * down * (1 + 1 / 2)})
    assert out["iowa"] == pytest.approx(
        {"internet": share["virginia"] * up + share["iowa"] * down, "inter_region": share["iowa"] * down / 2}
    )
    assert out["tokyo"] == pytest.approx({"internet": share["virginia"] * up / 2, "inter_region": share["iowa"] * up / 2})

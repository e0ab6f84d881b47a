"""``up`` fails over while it creates, as the controller does later: a refused zone is left for the next placement."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ddctl.config.regions import parse_regions
from ddctl.control.plan import PlannedInstance, desired, plan
from ddctl.control.reconcile import Placement, reconcile
from ddctl.control.state import State
from ddctl.control.up import _carry_out
from ddctl.errors import ProvisionError
from ddctl.providers.base import InstanceSpec
from ddctl.providers.fake import FakeProvider, Fault

PLACES = (
    Placement(provider="fake", cloud_region="eu", zone="eu-a"),
    Placement(provider="fake", cloud_region="eu", zone="eu-b"),
    Placement(provider="fake", cloud_region="us"),
)


def carry_out(tmp_path: Path, fake: FakeProvider) -> tuple[State, list[str]]:
    state = State(tmp_path / "state.sqlite3")
    state.create_run("r", "regions.yaml", str(tmp_path / "job"), {})
    planned = [PlannedInstance(name="L0", region="east", provider="fake", role="learner", instance_type="g5.xlarge", spot=True,
                               max_dollars_per_hour=0.5, placements=PLACES)]  # fmt: skip
    specs = {"L0": InstanceSpec(run="r", name="L0", region="east", role="learner", argv=("agent",), log=tmp_path / "L0.log")}
    said: list[str] = []
    _carry_out(state, {"fake": fake}, planned, specs, reconcile(desired(planned), [], time.time()), said.append)
    return state, said


def test_capacity_moves_up_to_the_next_zone_and_quota_to_the_next_region(tmp_path: Path) -> None:
    fake = FakeProvider(faults=[Fault("capacity", "zone", "InsufficientInstanceCapacity", cloud_region="eu", zone="eu-a")])
    state, said = carry_out(tmp_path, fake)
    [record] = state.instances("r")
    assert (record.detail["spec"]["cloud_region"], record.detail["spec"]["zone"]) == ("eu", "eu-b")
    failed = [e for e in state.events("r", 100) if e.get("kind") == "provision-failed"]
    assert [(e["instance"], e["error"], e["code"]) for e in failed] == [("L0", "capacity", "InsufficientInstanceCapacity")]
    assert "L0: capacity (InsufficientInstanceCapacity) at eu/eu-a; trying eu/eu-b" in said

    fake = FakeProvider(faults=[Fault("quota", "region", "MaxSpotInstanceCountExceeded", cloud_region="eu")])
    state, _ = carry_out(tmp_path / "quota", fake)
    assert state.instances("r")[0].detail["spec"]["cloud_region"] == "us"  # the whole region is out, both zones skipped
    assert sum(1 for verb, _ in fake.calls if verb == "create") == 2


def test_a_throttled_create_is_retried_and_nowhere_left_is_an_error_that_says_why(tmp_path: Path) -> None:
    fake = FakeProvider(faults=[Fault("transient", "region", "RequestLimitExceeded", times=1)])
    state, _ = carry_out(tmp_path, fake)
    assert state.instances("r")[0].detail["spec"]["zone"] == "eu-a"  # backed off, then the same placement
    fake = FakeProvider(faults=[Fault("capacity", "zone", "InsufficientInstanceCapacity")])
    with pytest.raises(ProvisionError, match="InsufficientInstanceCapacity"):
        carry_out(tmp_path / "none", fake)
    failed = [e for e in State(tmp_path / "none" / "state.sqlite3").events("r", 100) if e.get("kind") == "provision-failed"]
    assert len(failed) == 3  # every placement tried once, each refusal in the event log


def test_a_synchronizer_fails_over_between_its_regions_zones_only(tmp_path: Path) -> None:
    """Its address is reserved in its region (in the certificate and every learner's URL): a regional address cannot
    follow it, so it waits for its own region rather than come up where no learner looks for it."""
    raw = {
        "synchronizer": {"shards": 2, "regions": ["east", "west"]},
        "regions": [
            {"name": name, "provider": "aws", "cloud_region": cloud, "zones": [f"{cloud}a", f"{cloud}b"],
             "fallback_regions": ["us-east-2"], "instance_type": "g5.xlarge"}
            for name, cloud in (("east", "us-east-1"), ("west", "us-west-2"))
        ],
    }  # fmt: skip
    rf = parse_regions(raw, tmp_path / "r.yaml")
    where = {i.name: [(p.cloud_region, p.zone) for p in i.placements] for i in plan(rf, {"east": "aws", "west": "aws"})}
    assert sorted(where) == ["L0", "L1", "syncer", "syncer-s1"]
    for name, places in where.items():
        cloud = places[0][0]
        zones = [(cloud, f"{cloud}a"), (cloud, f"{cloud}b")]
        assert places == (zones if name.startswith("syncer") else [*zones, ("us-east-2", "")]), name

"""One job across two clouds, end to end, offline: the syncer and a learner on AWS (moto), two learners on GCP spot (the fake).

Every VM boots as a Docker container on one "internet" bridge (the test hypervisor plays both clouds), its
link shaped as its region's WAN link (tc tbf both ways: 400 Mbit/s in us-east-1, 100 in us-central1, 50 in
europe-west4).
Everything ddctl does is the real path: boto3 against EC2's API and google-cloud-compute against the
Compute REST API, first-boot scripts that pin host keys, the deploy over SSH, GCP learners reaching the
syncer's Elastic IP on AWS over TLS with the job's pinned CA, the syncer's port opened to exactly the
run's learners across clouds, a GCE preemption (``simulateMaintenanceEvent``, read from
``instance/preempted``) replaced in the next zone after a zone-exhausted refusal, an EC2 interruption through
FIS replaced too, and ``down`` leaving nothing in either cloud and no container.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import gcp_shapes
from aws_cloud import AwsCloud
from aws_hypervisor import HV_LABEL, Hypervisor
from builders import decided, every_learner_training, merged, recorded, status_json, syncer_row
from ddctl.cli.app import app
from ddctl.providers.docker.engine import Engine, engine_unavailable
from ddctl_agents.waiting import wait_until
from gcp_cloud import GcpCloud

pytestmark = [pytest.mark.slow, pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}")]
runner = CliRunner()
IMAGE = "ami-12c6146b"  # one of moto's stock AMIs; the hypervisor boots the project's VM image for every VM


def _regions(tmp_path: Path) -> Path:
    common = {"python": sys.executable, "learners": 1}
    regions = {
        "run": "multi",
        "syncer": "virginia",
        "training": {"preset": "tiny", "tokens": 6_000_000, "fragments": 2, "inner_steps": 8},
        "regions": [
            {"name": "virginia", "provider": "aws", "cloud_region": "us-east-1", "instance_type": "g5.xlarge", "image": IMAGE,
             **common},
            {"name": "iowa", "provider": "gcp", "cloud_region": "us-central1", "zones": ["us-central1-a", "us-central1-b"],
             "instance_type": "g2-standard-4", **common},
            {"name": "netherlands", "provider": "gcp", "cloud_region": "europe-west4", "instance_type": "g2-standard-4",
             **common},
        ],
    }  # fmt: skip
    path = tmp_path / "multi.yaml"
    path.write_text(yaml.safe_dump(regions))
    return path


def _aws_live(aws: AwsCloud, run: str) -> dict[str, dict[str, Any]]:
    found = aws.client("ec2", "us-east-1").describe_instances(Filters=[{"Name": "tag:ddctl-run", "Values": [run]}])
    vms = [i for r in found["Reservations"] for i in r["Instances"] if i["State"]["Name"] != "terminated"]
    return {next(t["Value"] for t in i["Tags"] if t["Key"] == "ddctl-name"): i for i in vms}


def _gcp_live(gcp: GcpCloud) -> dict[str, dict[str, Any]]:
    return {
        next(m["value"] for m in i["metadata"]["items"] if m["key"] == "ddctl-name"): i
        for i in gcp.instances()
        if i["status"] in ("PROVISIONING", "STAGING", "RUNNING")
    }


def _syncer_port_sources(aws: AwsCloud, run: str) -> set[str]:
    (group,) = aws.client("ec2", "us-east-1").describe_security_groups(Filters=[{"Name": "tag:ddctl-run", "Values": [run]}])[
        "SecurityGroups"
    ]
    return {r["CidrIp"] for p in group["IpPermissions"] if p.get("FromPort") == 8443 for r in p.get("IpRanges", [])}


def _replaced(run: str, name: str, before: dict[str, Any]) -> dict[str, Any]:
    """Wait for ``name``'s replacement to register and get an update merged; returns its first row."""
    first = wait_until(
        lambda: (row if (row := syncer_row(run, name))["incarnation"] != before["incarnation"] else None),
        timeout_s=240, every_s=0.25, what=f"the replacement of {name} to register",
    )  # fmt: skip
    wait_until(
        lambda: merged(syncer_row(run, name)) > merged(first), timeout_s=180, every_s=0.25,
        what=f"the replacement of {name}'s first accepted update",
    )  # fmt: skip
    return first


def test_one_job_spans_aws_and_gcp_survives_a_preemption_in_each_and_down_leaves_nothing(
    aws: AwsCloud, gcp: GcpCloud, tmp_path: Path
) -> None:
    links = {"us-east-1": (400.0, 400.0), "us-central1": (100.0, 100.0), "europe-west4": (50.0, 50.0)}  # Mbit/s up, down
    with Hypervisor(aws, regions=["us-east-1"], gcp=gcp, links=links) as hv:
        planned = runner.invoke(app, ["up", "-f", str(_regions(tmp_path)), "--plan", "--json"])
        assert planned.exit_code == 0, planned.output
        pairs = {(p["from"], p["to"]): p for p in json.loads(planned.stdout)["cost"]["egress_by_cloud"]}
        assert set(pairs) == {("aws", "gcp"), ("gcp", "aws")} and all(p["dollars_per_hour"] > 0 for p in pairs.values())
        up = runner.invoke(app, ["up", "-f", str(_regions(tmp_path)), "--json"])
        assert up.exit_code == 0, up.output
        started = json.loads(up.stdout)
        run = started["run"]
        try:
            assert started["provider"] == "aws,gcp" and started["rounds"] >= 1
            eip = aws.client("ec2", "us-east-1").describe_addresses()["Addresses"][0]["PublicIp"]
            assert started["url"] == f"https://{eip}:8443"
            on_gcp = _gcp_live(gcp)
            assert sorted(on_gcp) == ["L1", "L2"] and sorted(_aws_live(aws, run)) == ["L0", "syncer"]
            assert {i["scheduling"]["provisioningModel"] for i in on_gcp.values()} == {"SPOT"}
            nat = {n: i["networkInterfaces"][0]["accessConfigs"][0]["natIP"] for n, i in on_gcp.items()}
            sources = _syncer_port_sources(aws, run)  # the syncer's port: the operator and exactly the run's learners
            assert {f"{a}/32" for a in nat.values()} | {f"{_aws_live(aws, run)['L0']['PublicIpAddress']}/32"} <= sources
            assert sorted(hv.shaped.values()) == sorted([links["us-east-1"]] * 2 + [links["us-central1"], links["europe-west4"]])
            status = every_learner_training({"virginia", "iowa", "netherlands"})
            wait_until(  # GCP learners train and are merged into the AWS syncer's model
                lambda: all(merged(syncer_row(run, n)) > 0 for n in ("L1", "L2")), timeout_s=120, every_s=0.5,
                what="both GCP learners merged",
            )  # fmt: skip

            # GCE preempts iowa's learner while us-central1-a is out of capacity: it leaves on instance/preempted,
            # the controller replaces it in us-central1-b; its old address leaves the syncer's firewall
            gcp.fail_operation("instances.insert", gcp_shapes.ZONE_EXHAUSTED, zone="us-central1-a", times=None)
            rounds, before, noticed = status["rounds"], syncer_row(run, "L1"), time.monotonic()
            chaos = runner.invoke(app, ["chaos", "preempt", "iowa", "--json"])
            assert chaos.exit_code == 0, chaos.output
            first = _replaced(run, "L1", before)
            print(f"\ngcp: preemption -> the replacement's first accepted update: {time.monotonic() - noticed:.1f} s")
            assert decided(first) > decided(before)  # the preempted incarnation's early push arrived and was decided
            replacement = _gcp_live(gcp)["L1"]
            assert replacement["zone"].endswith("/us-central1-b")
            after = status_json()
            failed = recorded(run, "provision-failed", "L1")
            assert failed and failed[0]["error"] == "capacity", after["events"][-20:]
            new_nat = replacement["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
            wait_until(
                lambda: f"{new_nat}/32" in (s := _syncer_port_sources(aws, run)) and f"{nat['L1']}/32" not in s,
                timeout_s=30, what="the syncer's firewall to follow the replacement",
            )  # fmt: skip

            # EC2 interrupts virginia's learner through FIS: it leaves on its notice and is replaced
            before, noticed = syncer_row(run, "L0"), time.monotonic()
            chaos = runner.invoke(app, ["chaos", "preempt", "virginia", "--notice", "30", "--json"])
            assert chaos.exit_code == 0, chaos.output
            assert json.loads(chaos.stdout)["seconds_to_exit"] < 30
            _replaced(run, "L0", before)
            print(f"aws: notice -> the replacement's first accepted update: {time.monotonic() - noticed:.1f} s")
            assert status_json()["rounds"] > rounds  # the job kept merging through both
            assert not hv.errors.get("gce"), hv.errors
        finally:
            down = runner.invoke(app, ["down", "--run", run, "--json"])
        assert down.exit_code == 0, down.output
        assert _aws_live(aws, run) == {} and gcp.instances() == [] and gcp.firewalls() == [] and gcp.addresses() == []
        ec2 = aws.client("ec2", "us-east-1")
        assert ec2.describe_security_groups(Filters=[{"Name": "tag:ddctl-run", "Values": [run]}])["SecurityGroups"] == []
        assert ec2.describe_addresses()["Addresses"] == []
        with Engine() as engine:
            wait_until(lambda: engine.containers({HV_LABEL: "1"}) == [], timeout_s=10, what="every VM's container gone")

"""``ddctl up`` on AWS, end to end, offline: moto's server is the cloud, the test hypervisor boots its VMs.

Two AWS regions train the tiny preset. Everything ddctl does is the real path:
boto3 against EC2's API (moto), user data that pins the host key, the deploy
over SSH, learners reaching the syncer's Elastic IP, a spot interruption
through FIS with its IMDSv2 notice, a capacity refusal the controller fails
over from, and ``down`` leaving nothing in any region. Needs Docker and root
(the hypervisor's IMDS address), as the Docker dry-run tests do.
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

from aws_cloud import AwsCloud
from aws_hypervisor import HV_LABEL, Hypervisor
from builders import decided, every_learner_training, merged, recorded, status_json, syncer_row
from ddctl.cli.app import app
from ddctl.providers.docker.engine import Engine, engine_unavailable
from ddctl_agents.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}")]
runner = CliRunner()
REGIONS = ("us-east-1", "eu-west-1")
IMAGE = "ami-12c6146b"  # one of moto's stock AMIs; the hypervisor boots the project's VM image for every AMI


def _regions(tmp_path: Path) -> Path:
    common = {"image": IMAGE, "python": sys.executable, "learners": 1}
    regions = {
        "run": "cloudy",
        "syncer": "virginia",
        "training": {"preset": "tiny", "tokens": 4_000_000, "fragments": 2, "inner_steps": 8},
        "checkpoints": {"every_rounds": 2, "every_minutes": 0},
        "regions": [
            {"name": "virginia", "provider": "aws", "cloud_region": "us-east-1", "zones": ["us-east-1a", "us-east-1b"],
             "instance_types": ["g6.xlarge", "g5.xlarge"], **common},
            {"name": "ireland", "provider": "aws", "cloud_region": "eu-west-1", "instance_type": "g5.xlarge", **common},
        ],
    }  # fmt: skip
    path = tmp_path / "aws.yaml"
    path.write_text(yaml.safe_dump(regions))
    return path


def _learner(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for region in status["regions"] for row in region["learners"] if row["id"] == name)


def _live(aws: AwsCloud, run: str) -> list[dict[str, Any]]:
    found = []
    for region in REGIONS:
        reservations = aws.client("ec2", region).describe_instances(Filters=[{"Name": "tag:ddctl-run", "Values": [run]}])
        found += [i for r in reservations["Reservations"] for i in r["Instances"] if i["State"]["Name"] != "terminated"]
    return found


def _first_summary(log: Path) -> dict[str, Any] | None:
    if not log.exists():
        return None
    lines = [line for line in log.read_text().splitlines() if line.startswith("{") and '"reason"' in line]
    return dict(json.loads(lines[0])) if lines else None


def test_two_aws_regions_train_survive_an_interruption_with_failover_and_leave_nothing(aws: AwsCloud, tmp_path: Path) -> None:
    with Hypervisor(aws, regions=REGIONS):
        planned = runner.invoke(app, ["up", "-f", str(_regions(tmp_path)), "--plan", "--json"])
        assert planned.exit_code == 0, planned.output
        expected = json.loads(planned.stdout)["cost"]["total_dollars_per_hour"]  # moto's spot prices, our tables
        up = runner.invoke(app, ["up", "-f", str(_regions(tmp_path)), "--json"])
        assert up.exit_code == 0, up.output
        started = json.loads(up.stdout)
        run = started["run"]
        try:
            assert started["provider"] == "aws" and started["rounds"] >= 1
            listed = runner.invoke(app, ["ls", "--json"])
            [row] = [r for r in json.loads(listed.stdout)["runs"] if r["run"] == run]
            assert row["dollars_per_hour"] == expected > 0  # the run is charged what its plan said
            vms = {next(t["Value"] for t in i["Tags"] if t["Key"] == "ddctl-name"): i for i in _live(aws, run)}
            assert sorted(vms) == ["L0", "L1", "syncer"]
            assert "InstanceLifecycle" not in vms["syncer"] and {vms[n]["InstanceLifecycle"] for n in ("L0", "L1")} == {"spot"}
            assert vms["L0"]["Placement"]["AvailabilityZone"] == "us-east-1a" and vms["L1"]["Placement"][
                "AvailabilityZone"
            ].startswith("eu-west-1")
            eip = aws.client("ec2", "us-east-1").describe_addresses()["Addresses"][0]["PublicIp"]
            assert started["url"] == f"https://{eip}:8443" and vms["syncer"]["PublicIpAddress"] == eip
            status = every_learner_training({"virginia", "ireland"})

            # an interruption through FIS while us-east-1a has no capacity: the learner leaves on its notice, pushing
            # its drift; the controller replaces it in us-east-1b; the job keeps merging
            aws.fail("RunInstances", "InsufficientInstanceCapacity", zone="us-east-1a")
            rounds, before, noticed = status["rounds"], syncer_row(run, "L0"), time.monotonic()
            chaos = runner.invoke(app, ["chaos", "preempt", "virginia", "--notice", "30", "--json"])
            assert chaos.exit_code == 0, chaos.output
            assert json.loads(chaos.stdout)["seconds_to_exit"] < 30  # it left on the notice, before FIS's kill
            log = tmp_path / "home" / "runs" / run / "logs" / "L0.log"
            summary = wait_until(lambda: _first_summary(log), timeout_s=60, every_s=0.5, what="the VM's last words collected")
            assert summary["reason"] == "preemption_notice" and summary["drained"]
            assert sum(summary["acked_tokens"].values()) == summary["sent_tokens"] > 0

            def joined() -> dict[str, Any] | None:
                row = syncer_row(run, "L0")
                return row if row["incarnation"] != before["incarnation"] else None

            first = wait_until(joined, timeout_s=240, every_s=0.25, what="the replacement to register")
            assert decided(first) > decided(before)  # the first incarnation's early push arrived and was decided
            wait_until(
                lambda: merged(syncer_row(run, "L0")) > merged(first), timeout_s=120, every_s=0.25,
                what="the replacement's first accepted update",
            )  # fmt: skip
            recovery_s = time.monotonic() - noticed
            print(f"\nnotice -> the replacement's first accepted update: {recovery_s:.1f} s")
            after = status_json()
            assert after["rounds"] > rounds and _learner(after, "L0")["zone"] == "us-east-1b"
            vms = {next(t["Value"] for t in i["Tags"] if t["Key"] == "ddctl-name"): i for i in _live(aws, run)}
            assert vms["L0"]["Placement"]["AvailabilityZone"] == "us-east-1b"
            failed = recorded(run, "provision-failed", "L0")
            assert failed and failed[0]["error"] == "capacity", after["events"][-20:]  # the controller's reason, recorded
            attempts = [(c.zone, c.status) for c in aws.calls("RunInstances") if c.region == "us-east-1"]
            assert ("us-east-1a", 500) in attempts and attempts[-1] == ("us-east-1b", 200)

            # the model so far, from the syncer's own VM over SSH (no disk of it here, no object storage named)
            pulled = runner.invoke(app, ["pull", run, "--out", str(tmp_path / "model"), "--json"])
            assert pulled.exit_code == 0, pulled.output
            result = json.loads(pulled.stdout)
            assert result["from"].startswith("aws syncer:") and 2 <= result["rounds"] <= status_json()["rounds"]
            assert (tmp_path / "model" / "model.safetensors").stat().st_size > 1_000_000
        finally:
            down = runner.invoke(app, ["down", "--run", run, "--json"])
        assert down.exit_code == 0, down.output
        removed = json.loads(down.stdout)["removed"]
        assert {"security group", "key pair", "elastic ip"} <= set(removed), removed
        assert _live(aws, run) == []
        for region in REGIONS:
            ec2 = aws.client("ec2", region)
            assert ec2.describe_security_groups(Filters=[{"Name": "tag:ddctl-run", "Values": [run]}])["SecurityGroups"] == []
            assert ec2.describe_key_pairs()["KeyPairs"] == [] and ec2.describe_addresses()["Addresses"] == []
        with Engine() as engine:
            wait_until(lambda: engine.containers({HV_LABEL: "1"}) == [], timeout_s=10, what="every VM's container gone")

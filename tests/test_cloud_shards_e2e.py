"""A sharded synchronizer on cloud VMs, end to end, offline: moto's server and the Compute fake are the clouds, the
test hypervisor boots their VMs.

One region on AWS and one on GCP, one learner each, ``synchronizer: shards: 2``: each shard runs on an on-demand VM
of its own in the region the plan puts it, behind the address its cloud reserved for it (an Elastic IP, a GCE static
address); every learner routes each fragment to its owner over the shards' public addresses, across the clouds; the
job runs to its end, the controller joins the shards' final model and brings their tapes home, ``pull`` and
``replay --run`` work, and ``down`` leaves nothing (every shard's address released) in either cloud. Shards in two
EC2 regions are the providers' tests' (``tests/test_cloud_shards.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from aws_cloud import AwsCloud
from aws_hypervisor import Hypervisor
from builders import merged, shards_finished, status_json
from ddctl.cli.app import app
from ddctl.control.rundir import RunDir
from ddctl.providers.docker.engine import engine_unavailable
from ddctl_agents.waiting import wait_until
from gcp_cloud import GcpCloud

pytestmark = [pytest.mark.slow, pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}")]
runner = CliRunner()
RUN = "shardy"
IMAGE = "ami-12c6146b"
AWS_REGION = {"provider": "aws", "instance_type": "g5.xlarge", "image": IMAGE}
GCP_REGION = {"provider": "gcp", "instance_type": "g2-standard-4"}
REGIONS = {"virginia": (AWS_REGION, "us-east-1"), "iowa": (GCP_REGION, "us-central1")}  # name -> (settings, cloud region)
AWS_CLOUDS = [cloud for settings, cloud in REGIONS.values() if settings["provider"] == "aws"]


def _regions(tmp_path: Path) -> Path:
    regions = {
        "run": RUN,
        "synchronizer": {"shards": 2},
        "training": {"preset": "tiny", "tokens": 300_000, "fragments": 4, "inner_steps": 8, "max_bytes": 1 << 21},
        "regions": [
            {"name": name, "cloud_region": cloud, "python": sys.executable, "learners": 1, **settings}
            for name, (settings, cloud) in REGIONS.items()
        ],
    }
    path = tmp_path / "clouds.yaml"
    path.write_text(yaml.safe_dump(regions))
    return path


def _vms(aws: AwsCloud, gcp: GcpCloud) -> dict[str, tuple[str, str, bool]]:
    """Instance name -> (cloud region, public address, spot) of the run's live VMs in both clouds."""
    found = {}
    for cloud in AWS_CLOUDS:
        reservations = aws.client("ec2", cloud).describe_instances(Filters=[{"Name": "tag:ddctl-run", "Values": [RUN]}])
        for vm in (i for r in reservations["Reservations"] for i in r["Instances"] if i["State"]["Name"] != "terminated"):
            name = next(t["Value"] for t in vm["Tags"] if t["Key"] == "ddctl-name")
            found[name] = (cloud, vm.get("PublicIpAddress", ""), "InstanceLifecycle" in vm)
    for vm in gcp.instances():
        if vm["status"] in ("PROVISIONING", "STAGING", "RUNNING"):
            name = next(m["value"] for m in vm["metadata"]["items"] if m["key"] == "ddctl-name")
            nat = vm["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
            found[name] = (vm["zone"].rsplit("/", 1)[1].rsplit("-", 1)[0], nat, vm["scheduling"]["provisioningModel"] == "SPOT")
    return found


def _addresses(aws: AwsCloud, gcp: GcpCloud) -> dict[str, tuple[str, str]]:
    """Synchronizer instance name -> (cloud region, public address) of every address reserved in both clouds."""
    found = {
        next(t["Value"] for t in a.get("Tags", []) if t["Key"] == "ddctl-name"): (cloud, a["PublicIp"])
        for cloud in AWS_CLOUDS
        for a in aws.client("ec2", cloud).describe_addresses()["Addresses"]
    }
    for a in gcp.addresses():
        found[a["name"].removeprefix(f"ddctl-{RUN}-")] = (a["region"].rsplit("/", 1)[1], a["address"])
    return found


def test_each_shard_runs_on_a_vm_of_its_own_behind_its_own_address_to_the_jobs_end(
    aws: AwsCloud, gcp: GcpCloud, tmp_path: Path
) -> None:
    """One shard on each cloud; every learner is told both shards' addresses, each reserved by its own cloud."""
    with Hypervisor(aws, regions=AWS_CLOUDS, gcp=gcp):
        planned = runner.invoke(app, ["up", "-f", str(_regions(tmp_path)), "--plan", "--json"])
        assert planned.exit_code == 0, planned.output
        placed = {s["index"]: (s["region"], s["fragments"]) for s in json.loads(planned.stdout)["synchronizer"]["shards"]}
        assert sorted(region for region, _ in placed.values()) == sorted(REGIONS)  # one shard in each region
        up = runner.invoke(app, ["up", "-f", str(_regions(tmp_path)), "--json"])
        assert up.exit_code == 0, up.output
        started = json.loads(up.stdout)
        run = started["run"]
        try:
            reserved = _addresses(aws, gcp)
            names = {0: "syncer", 1: "syncer-s1"}
            assert {name: cloud for name, (cloud, _) in reserved.items()} == {
                names[i]: REGIONS[region][1] for i, (region, _) in placed.items()
            }  # each shard's address, reserved in its own region
            assert started["shards"] == [f"https://{reserved[names[i]][1]}:8443" for i in range(2)] == RunDir(run).urls()
            vms = _vms(aws, gcp)
            assert sorted(vms) == ["L0", "L1", "syncer", "syncer-s1"]
            for name in names.values():  # on demand, at its own address, in its region
                assert vms[name] == (*reserved[name], False)
            shown = wait_until(lambda: (s := status_json())["shards"] and all(r["reachable"] for r in s["shards"]) and s,
                               timeout_s=120, what="both shards answering")  # fmt: skip
            assert {r["shard"]: (r["site"]["name"], r["owned"]) for r in shown["shards"]} == {
                "S0": placed[0], "S1": placed[1]
            }  # fmt: skip

            finals = wait_until(shards_finished(run), timeout_s=600, every_s=0.5, what="both shards finished")
            assert all(s["rounds"] > 0 for s in finals)  # each shard merged its own fragments' rounds
            for s in finals:  # from both learners, over the shards' public addresses
                assert {row["id"] for row in s["learners"] if merged(row) > 0} == {"L0", "L1"}, s["learners"]

            def concluded() -> dict[str, Any] | None:
                runs = json.loads(runner.invoke(app, ["ls", "--json"]).stdout)["runs"]
                return next((r for r in runs if r["run"] == run and r["state"] == "finished"), None)

            row = wait_until(concluded, timeout_s=240, every_s=2.0, what="the controller to join the final model")
            assert row["result"] == str(RunDir(run).final)
            shown = runner.invoke(app, ["status", "--run", run, "--json"])
            assert shown.exit_code == 0, shown.output
            summary = json.loads(shown.stdout)["job"]["summary"]
            assert summary["rounds"] == sum(s["rounds"] for s in finals) and summary["learners_finished"] == ["L0", "L1"]
            pulled = runner.invoke(app, ["pull", "--run", run, "--out", str(tmp_path / "model"), "--json"])
            assert pulled.exit_code == 0, pulled.output
            assert json.loads(pulled.stdout)["val_bpb"] == pytest.approx(summary["val_bpb"], abs=1e-5)
            replayed = runner.invoke(app, ["replay", "--run", run, "--json"])  # the shards' tapes came home from their VMs
            assert replayed.exit_code == 0, replayed.output
            again = json.loads(replayed.stdout)
            assert again["match"] and again["shards"] == 2 and again["val_bpb"] == pytest.approx(summary["val_bpb"], abs=1e-5)
        finally:
            down = runner.invoke(app, ["down", "--run", run, "--json"])
        assert down.exit_code == 0, down.output
        assert _vms(aws, gcp) == {} and _addresses(aws, gcp) == {}  # every shard's address released
        assert gcp.firewalls() == []
        for cloud in AWS_CLOUDS:
            ec2 = aws.client("ec2", cloud)
            assert ec2.describe_security_groups(Filters=[{"Name": "tag:ddctl-run", "Values": [run]}])["SecurityGroups"] == []
            assert ec2.describe_key_pairs()["KeyPairs"] == []

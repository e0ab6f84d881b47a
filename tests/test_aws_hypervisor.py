"""The test hypervisor boots moto's instances as Docker VMs: user data, pinned SSH, power-off, EIPs, FIS, IMDS.

The AWS provider's end-to-end tests lean on it, so it is proven here against a real moto server (AwsCloud)
and a real Docker engine, through the same calls the provider makes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aws_cloud import AwsCloud
from aws_hypervisor import HV_LABEL, NETWORK, Hypervisor
from ddctl.errors import DeployError
from ddctl.providers import deploy, unavailable
from ddctl.providers.aws import interruptions as fis
from ddctl.providers.aws.clients import Clients
from ddctl.providers.docker.engine import Engine
from ddctl_agents.waiting import wait_until
from fis_experiments import interruptions, parse_duration
from hv_metadata import IMDS_ADDRESS, REBALANCE_PATH

WHY_NOT = unavailable("docker") or (None if os.geteuid() == 0 else "needs root (an address on lo, port 80)")
needs_docker = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
REGIONS = ["us-east-1", "eu-west-1"]
ACCOUNT = "123456789012"
NOTICE_PATH = "/latest/meta-data/spot/instance-action"
PROBE = """
import json, sys, urllib.request as u
base, notice, rebalance = sys.argv[1:]
def get(path, token=""):
    try:
        with u.urlopen(u.Request(base + path, headers={"X-aws-ec2-metadata-token": token}), timeout=2) as answer:
            return [answer.status, json.loads(answer.read() or "null")]
    except u.HTTPError as e:
        return [e.code, None]
put = u.Request(base + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
token = u.urlopen(put, timeout=2).read().decode()
print(json.dumps({"untokened": get(notice)[0], "notice": get(notice, token), "rebalance": get(rebalance, token)}))
"""
"""IMDSv2 as the learner's notice watcher speaks it, run inside the VM with the VM's python (the host's)."""


def test_iso_durations() -> None:
    assert [parse_duration(d) for d in ("PT2M", "PT5S", "PT1M30S", "PT0.5S", "P1DT1H")] == [120, 5, 90, 0.5, 90000]
    for bad in ("2M", "PT", "PT5X", ""):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_interruptions_of_an_experiment() -> None:
    arn = f"arn:aws:ec2:eu-west-1:{ACCOUNT}:instance/"
    experiment: dict[str, Any] = {
        "targets": {"spot": {"resourceType": "aws:ec2:spot-instance", "resourceArns": [arn + "i-1", arn + "i-2"]}},
        "actions": {
            "interrupt": {"actionId": "aws:ec2:send-spot-instance-interruptions", "targets": {"SpotInstances": "spot"}},
            "wait": {"actionId": "aws:fis:wait", "parameters": {"duration": "PT1M"}},
        },
    }
    assert interruptions(experiment) == [("i-1", 120.0), ("i-2", 120.0)]  # AWS's default notice: two minutes
    experiment["actions"]["interrupt"]["parameters"] = {"durationBeforeInterruption": "PT5S"}
    assert interruptions(experiment) == [("i-1", 5.0), ("i-2", 5.0)]


# -- against moto and Docker ------------------------------------------------------------------
@pytest.fixture
def hv(aws: AwsCloud) -> Iterator[Hypervisor]:
    with Hypervisor(aws, regions=REGIONS) as running:
        yield running
        assert running.errors == {}


class Vm:
    """One instance launched the way the provider does: user data that installs its keys and its power-off script."""

    def __init__(
        self, cloud: AwsCloud, client_key: Path, region: str = "us-east-1", role: str = "learner", user_data: str = ""
    ) -> None:
        self.ec2, self.region = cloud.client("ec2", region), region
        host_private, self.host_key = deploy.new_keypair()
        user_data = user_data or "\n".join(
            [
                "#!/bin/sh",
                "set -e",
                "umask 077",
                "mkdir -p /etc/ssh /root/.ssh /opt/ddctl",
                f"printf '%s' {shlex.quote(host_private.decode())} >/etc/ssh/ssh_host_ed25519_key",
                f"printf '%s\\n' {shlex.quote(self.host_key)} >/etc/ssh/ssh_host_ed25519_key.pub",
                f"printf '%s\\n' {shlex.quote(deploy.ensure_client_key(client_key))} >/root/.ssh/authorized_keys",
                "printf '#!/bin/sh\\nshutdown -h now\\n' >/opt/ddctl/poweroff",
                "chmod 755 /opt/ddctl/poweroff",
                "systemctl restart ssh 2>/dev/null || true",
            ]
        )
        tags = {"ddctl-run": "hv", "ddctl-name": f"{role}-{region}", "ddctl-role": role, "ddctl-region": region}
        launched = self.ec2.run_instances(
            ImageId="ami-12c6146b",
            InstanceType="g5.xlarge",
            MinCount=1,
            MaxCount=1,
            UserData=user_data,
            InstanceMarketOptions={"MarketType": "spot"},
            InstanceInitiatedShutdownBehavior="terminate",
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )["Instances"][0]
        self.id, self.address, self.client_key = launched["InstanceId"], launched["PublicIpAddress"], client_key

    def target(self) -> deploy.Target:
        return deploy.Target(self.address, self.host_key, self.client_key)

    def state(self) -> str:
        return str(self.ec2.describe_instances(InstanceIds=[self.id])["Reservations"][0]["Instances"][0]["State"]["Name"])

    def imds(self) -> dict[str, Any]:
        code, out, err = deploy.run_command(
            self.target(), shlex.join([sys.executable, "-c", PROBE, f"http://{IMDS_ADDRESS}", NOTICE_PATH, REBALANCE_PATH])
        )
        assert code == 0, err
        return dict(json.loads(out))


def booted(hv: Hypervisor, vm: Vm) -> None:
    wait_until(lambda: hv.address(vm.id) == vm.address, timeout_s=10, what=f"{vm.id}'s container at {vm.address}")


def container(hv: Hypervisor, vm: Vm) -> dict[str, Any]:
    info = hv.engine.inspect(hv.container(vm.id) or "?")
    assert info is not None, f"{vm.id} has no container"
    return dict(info)


def removed(hv: Hypervisor, vm: Vm, timeout_s: float = 10) -> None:
    wait_until(lambda: vm.state() == "terminated", timeout_s=timeout_s, what=f"{vm.id} terminated in moto")
    gone = lambda: hv.container(vm.id) is None and not hv.engine.containers({"ddctl-hv-instance": vm.id})  # noqa: E731
    wait_until(gone, timeout_s=10, what=f"{vm.id}'s container removed")


@pytest.mark.slow
@needs_docker
def test_user_data_boots_a_vm_that_powers_itself_off(hv: Hypervisor, aws: AwsCloud, tmp_path: Path) -> None:
    vm = Vm(aws, tmp_path / "id_ed25519")
    booted(hv, vm)
    assert deploy.run_command(vm.target(), "cat /opt/ddctl/poweroff") == (0, "#!/bin/sh\nkill 1\n", "")  # the power button
    assert deploy.run_command(vm.target(), "stat -c %a /etc/ssh/ssh_host_ed25519_key")[1].strip() == "600"
    with pytest.raises(DeployError, match="host key does not match"):  # the pinned key is the one the user data installed
        deploy.run_command(deploy.Target(vm.address, deploy.new_keypair()[1], vm.client_key), "true")
    labels = container(hv, vm)["Config"]["Labels"]
    assert (labels["ddctl-hv-instance"], labels["ddctl-hv-run"], labels["ddctl-hv-name"]) == (vm.id, "hv", "learner-us-east-1")

    deploy.run_command(vm.target(), "(sleep 0.3; /opt/ddctl/poweroff) >/dev/null 2>&1 &")  # as the agent's exit path does
    removed(hv, vm)


@pytest.mark.slow
@needs_docker
def test_elastic_ip_imds_and_a_fis_spot_interruption(hv: Hypervisor, aws: AwsCloud, tmp_path: Path) -> None:
    vm = Vm(aws, tmp_path / "id_ed25519", region="eu-west-1", role="syncer")
    booted(hv, vm)  # at its launch address; the provider associates the EIP right after, here later: it must follow
    eip = vm.ec2.allocate_address(Domain="vpc")
    vm.ec2.associate_address(InstanceId=vm.id, AllocationId=eip["AllocationId"])  # moto moves PublicIpAddress to it
    vm.address = eip["PublicIp"]
    booted(hv, vm)
    networks = container(hv, vm)["NetworkSettings"]["Networks"]
    assert {name: n["IPAddress"] for name, n in networks.items()} == {NETWORK: vm.address}
    assert vm.imds() == {"untokened": 401, "notice": [404, None], "rebalance": [404, None]}

    hv.rebalance(vm.id)
    assert vm.imds()["rebalance"][0] == 200 and vm.imds()["rebalance"][1]["noticeTime"].endswith("Z")

    started = time.monotonic()
    fis.interrupt(Clients(), vm.region, "hv", vm.id, notice_s=8.0)  # the FIS experiment `ddctl chaos preempt` starts
    # each look is an SSH session into the VM: eight seconds leave a loaded machine several looks before the kill
    notice = wait_until(lambda: (n := vm.imds()["notice"])[0] == 200 and n, timeout_s=7, every_s=0.2, what="the notice")
    assert notice[1]["action"] == "terminate" and notice[1]["time"].endswith("Z")
    if time.monotonic() - started < 7.0:  # not killed at the notice (unless this machine was too slow to look in time)
        assert vm.state() == "running"
    removed(hv, vm)
    assert time.monotonic() - started >= 7.8  # the notice's two minutes (here eight seconds) are honoured


@pytest.mark.slow
@needs_docker
def test_a_failing_instance_does_not_stop_the_others(hv: Hypervisor, aws: AwsCloud, tmp_path: Path) -> None:
    aws.fail("DescribeInstanceAttribute", "UnauthorizedOperation", times=1)  # the first boot fails; the next tick retries
    first = Vm(aws, tmp_path / "id_ed25519")
    wait_until(lambda: first.id in hv.errors, timeout_s=10, what="the failed boot in hv.errors")
    assert "UnauthorizedOperation" in hv.errors.pop(first.id)
    broken = Vm(aws, tmp_path / "id_ed25519", user_data="#!/bin/sh\necho no disk >&2\nexit 3\n")
    booted(hv, first)
    removed(hv, broken)  # its boot script failed: the VM never came up, it powered off
    assert deploy.run_command(first.target(), "hostname") == (0, f"{first.id}\n", "")


@pytest.mark.slow
@needs_docker
def test_terminate_from_outside_removes_the_container_and_stop_leaves_nothing(aws: AwsCloud, tmp_path: Path) -> None:
    hv = Hypervisor(aws, regions=REGIONS).start()
    try:
        here, there = Vm(aws, tmp_path / "id_ed25519"), Vm(aws, tmp_path / "id_ed25519", region="eu-west-1")
        booted(hv, here)
        booted(hv, there)
        here.ec2.terminate_instances(InstanceIds=[here.id])
        removed(hv, here)
        assert deploy.run_command(there.target(), "hostname") == (0, f"{there.id}\n", "")
    finally:
        hv.stop()
    engine = Engine()
    assert (
        f"inet {IMDS_ADDRESS}/" not in subprocess.run(["ip", "addr", "show", "dev", "lo"], capture_output=True, text=True).stdout
    )
    assert engine.containers({HV_LABEL: "1"}) == [] and engine.networks({HV_LABEL: "1"}) == []
    assert all(n["Name"] != NETWORK for n in engine.http.get("/networks").json())
    assert hv.errors == {}

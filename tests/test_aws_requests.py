"""The aws provider's pure parts: what EC2 is asked (RunInstances, user data, tags) and how its refusals read."""

from __future__ import annotations

import base64
from pathlib import Path

import botocore.exceptions
import pytest

from ddctl.errors import ProvisionError
from ddctl.providers.aws.errors import classify
from ddctl.providers.aws.machines import Machine, launch_request, private_address, public_address, tags
from ddctl.providers.aws.orphans import expired, orphaned
from ddctl.providers.base import InstanceSpec
from ddctl.providers.console import last_files, log_text
from ddctl.providers.firstboot import first_boot

SPEC = InstanceSpec(run="r1", name="L3", region="east", role="learner", argv=("python",), log=Path("/tmp/l"))


def client_error(code: str, status: int, message: str = "no") -> botocore.exceptions.ClientError:
    response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, "RunInstances")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "status", "kind", "scope"),
    [
        ("InsufficientInstanceCapacity", 500, "capacity", "zone"),
        ("SpotMaxPriceTooLow", 400, "capacity", "zone"),
        ("Unsupported", 400, "capacity", "zone"),
        ("MaxSpotInstanceCountExceeded", 400, "quota", "region"),
        ("VcpuLimitExceeded", 400, "quota", "region"),
        ("AuthFailure", 401, "credentials", "cloud"),
        ("UnauthorizedOperation", 403, "credentials", "cloud"),
        ("RequestLimitExceeded", 503, "transient", "region"),
        ("InternalError", 500, "transient", "region"),
        ("SomethingNew", 502, "transient", "region"),
        ("InvalidParameterValue", 400, "config", "cloud"),
        ("InvalidAMIID.NotFound", 400, "config", "cloud"),
    ],
)
def test_each_ec2_code_means_what_failover_needs(code: str, status: int, kind: str, scope: str) -> None:
    error = classify(client_error(code, status, "EC2's words"), region="us-east-1", zone="us-east-1a")
    assert (error.kind, error.scope, error.code, error.provider) == (kind, scope, code, "aws")
    assert "EC2's words" in str(error) and "us-east-1a" in str(error) and error.where in ("us-east-1a", "us-east-1", "aws")


def test_credential_problems_name_the_profile_and_network_trouble_is_transient() -> None:
    missing = classify(botocore.exceptions.ProfileNotFound(profile="nightly"), credentials="profile 'nightly'")
    assert missing.kind == "credentials" and "profile 'nightly'" in str(missing)
    denied = classify(client_error("AuthFailure", 401, "AWS was not able to validate"), credentials="profile 'x'")
    assert denied.kind == "credentials" and "(credentials: profile 'x')" in str(denied)
    assert classify(botocore.exceptions.NoCredentialsError()).kind == "credentials"
    away = classify(botocore.exceptions.EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com"))
    assert away.kind == "transient"
    same = ProvisionError("x", kind="quota", scope="region")
    assert classify(same) is same


def test_a_learner_is_one_time_spot_that_terminates_with_imdsv2_and_its_tags_on_every_volume() -> None:
    machine = Machine(image="ami-1", python="/usr/bin/python3", spot=True, max_price=0.75)
    labels = tags(SPEC, "ssh-ed25519 AAAAhost", expires_at=0.0)
    request = launch_request(
        SPEC, machine, instance_type="g6.xlarge", subnet="subnet-1", security_group="sg-1", key_name="ddctl-r1",
        user_data="#!/bin/sh\n", tags=labels,
    )  # fmt: skip
    assert request["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "0.7500"},
    }
    assert request["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert request["MetadataOptions"]["HttpTokens"] == "required"
    assert request["NetworkInterfaces"][0]["Groups"] == ["sg-1"] and request["NetworkInterfaces"][0]["SubnetId"] == "subnet-1"
    kinds = {t["ResourceType"]: {x["Key"]: x["Value"] for x in t["Tags"]} for t in request["TagSpecifications"]}
    assert set(kinds) == {"instance", "volume"} and kinds["instance"] == kinds["volume"]
    assert kinds["instance"]["ddctl-run"] == "r1" and kinds["instance"]["ddctl-name"] == "L3"
    assert kinds["instance"]["ddctl-role"] == "learner" and kinds["instance"]["ddctl-expires-at"] == "1970-01-01T00:00:00Z"
    on_demand = launch_request(
        SPEC, Machine(image="ami-1", python="/p", spot=False), instance_type="m7i.large", subnet="s", security_group="g",
        key_name="k", user_data="", tags=labels,
    )  # fmt: skip
    assert "InstanceMarketOptions" not in on_demand


def test_the_user_data_installs_the_pinned_host_key_and_the_run_key_then_says_ready() -> None:
    script = first_boot(
        b"-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n",
        "ssh-ed25519 HOST",
        "ssh-ed25519 CLIENT",
        "/opt/py",
    )
    assert script.startswith("#!/bin/sh\n") and "set -e" in script
    assert "abc\n-----END OPENSSH PRIVATE KEY-----\nKEY\n" in script
    assert "echo 'ssh-ed25519 HOST' >/etc/ssh/ssh_host_ed25519_key.pub" in script
    assert "echo 'ssh-ed25519 CLIENT' >/root/.ssh/authorized_keys" in script
    assert "if [ ! -x /opt/py ]" in script and "torch==2.13.0" in script
    assert script.rstrip().endswith("touch /opt/ddctl/ready")
    assert base64.b64encode(script.encode())  # plain ASCII: EC2 takes it as is (boto3 base64-encodes it)


def test_orphans_are_dead_runs_and_expired_machines_only() -> None:
    def vm(run: str, expires: str, state: str = "running") -> dict[str, object]:
        return {
            "State": {"Name": state},
            "Tags": [{"Key": "ddctl-run", "Value": run}, {"Key": "ddctl-expires-at", "Value": expires}],
        }

    later, earlier = "2030-01-01T00:00:00Z", "2020-01-01T00:00:00Z"
    now = 1.9e9  # 2030-03
    fleet = [vm("live", "2031-01-01T00:00:00Z"), vm("dead", later), vm("live", earlier), vm("gone", earlier, "terminated")]
    assert orphaned(fleet, {"live"}, now) == [fleet[1], fleet[2]]  # a dead run, an expired machine of a live one
    assert not expired({"ddctl-expires-at": "soon"}, now)  # unreadable: never guessed to delete
    assert expired({"ddctl-expires-at": earlier}, now) and not expired({"ddctl-expires-at": later}, 1.8e9)


def test_what_ec2_says_about_an_instance_is_checked_before_it_becomes_a_host_or_a_rule() -> None:
    assert public_address({"PublicIpAddress": "100.100.0.7"}) == "100.100.0.7"
    for hostile in ("", None, "100.100.0.7/0", "0.0.0.0/0", "::1", "999.1.1.1", "a" * 10_000, 7, "1.2.3.4; rm -rf /"):
        assert public_address({"PublicIpAddress": hostile}) is None
    assert public_address({}) is None


def test_a_private_address_ec2_describes_is_used_only_if_it_is_an_ipv4_address() -> None:
    assert private_address({"PrivateIpAddress": "10.0.3.17"}) == "10.0.3.17"
    hostile = ("", None, "10.0.3.17/16", "10.0.0.300", "fd00::1", "10.0.3.17 ", "10.0.3.17; rm -rf /", 167969553, ["10.0.3.17"])
    assert [private_address({"PrivateIpAddress": value}) for value in hostile] == [""] * len(hostile)
    assert private_address({}) == ""


def test_a_consoles_last_words_survive_garbage_around_them() -> None:
    good = base64.b64encode(b'{"reason": "finished"}').decode()
    console = "\n".join(
        [
            "[    0.000] Linux version ...",
            f"ddctl-file /opt/ddctl/summary.json {good[:-4]}",  # truncated: skipped
            "ddctl-file /opt/ddctl/agent.exit not!base64",
            "ddctl-file only-two-fields",
            f"ddctl-file /opt/ddctl/summary.json {good}",
            "\x1b[31mcolour\x1b[0m and a NUL \x00",
        ]
    )
    assert last_files(console) == {"/opt/ddctl/summary.json": b'{"reason": "finished"}'}
    assert "ddctl-file" not in log_text(console) and "Linux version" in log_text(console)
    assert last_files("ddctl-file x " + "A" * 1_000_000) == {"x": b"\x00" * 750_000}  # big, but EC2 keeps 64 KB

"""The gcp provider against the fake Compute REST API: bootstrap, create with failover, the syncer's port, cleanup, orphans.

No VM boots here (``tests/test_multicloud_e2e.py`` boots them as Docker containers): the first-boot wait
and the agent's deploy are stood in for; everything GCE is asked goes through google-cloud-compute's REST
transport to the fake and is read back from it.
"""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from typing import Any

import pytest

import gcp_shapes
from builders import machines_that_would_answer
from ddctl.config.regions import Region
from ddctl.control.rundir import RunDir
from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers.base import InstanceSpec
from ddctl.providers.gcp import provider as gcp_provider
from ddctl.providers.gcp.clients import Clients
from ddctl.providers.gcp.provider import SYNCER_PORT, GcpProvider
from gcp_cloud import GcpCloud

RUN = "r1"
OPERATOR = "100.100.0.1/32"  # DDCTL_SSH_FROM in the fixture
IOWA = Region(name="iowa", provider="gcp", cloud_region="us-central1", zones=("us-central1-a", "us-central1-b"),
              instance_types=("g2-standard-4", "g2-standard-8"), python="/usr/bin/python3")  # fmt: skip
NETHERLANDS = Region(name="nl", provider="gcp", cloud_region="europe-west4", instance_type="g2-standard-4")


@pytest.fixture
def booted(gcp: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> GcpCloud:
    """VMs that would answer: the first-boot wait passes and the deploy is a no-op (no machine boots in these tests)."""
    machines_that_would_answer(monkeypatch, gcp_provider)
    return gcp


def spec_of(infos: dict[str, Any], name: str, region: Region, role: str = "learner", zone: str = "") -> InstanceSpec:
    return InstanceSpec(
        run=RUN, name=name, region=region.name, role=role, argv=("python3", "-m", "agent"), log=RunDir(RUN).log(name),
        cloud_region=region.cloud_region, zone=zone, machine=infos[region.name].machine,
    )  # fmt: skip


def rules(gcp: GcpCloud) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in gcp.firewalls()}


def test_bootstrap_is_idempotent_opens_ssh_to_the_operator_and_reserves_the_syncers_address(gcp: GcpCloud) -> None:
    infos = GcpProvider().bootstrap(RUN, [IOWA, NETHERLANDS], "iowa")
    inserted = len(gcp.calls("firewalls.insert"))
    assert GcpProvider().bootstrap(RUN, [IOWA, NETHERLANDS], "iowa") == infos  # another process finds the same things
    assert len(gcp.calls("firewalls.insert")) == inserted == 3  # ... and makes none of them again
    (address,) = gcp.addresses()
    assert address["name"] == "ddctl-r1-syncer" and address["region"].endswith("/regions/us-central1")
    assert infos["iowa"].syncer_host == infos["nl"].syncer_host == address["address"]
    assert infos["iowa"].syncer_port == SYNCER_PORT
    found = rules(gcp)
    assert set(found) == {"ddctl-r1-ssh", "ddctl-r1-syncer", "ddctl-r1-internal"}
    ssh, syncer = found["ddctl-r1-ssh"], found["ddctl-r1-syncer"]
    assert ssh["sourceRanges"] == [OPERATOR] and ssh["targetTags"] == ["ddctl-r1"]
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert syncer["sourceRanges"] == [OPERATOR] and syncer["targetTags"] == ["ddctl-r1-syncer"]
    assert syncer["allowed"] == [{"IPProtocol": "tcp", "ports": [str(SYNCER_PORT)]}]
    assert infos["iowa"].notice_url == "http://169.254.169.254/computeMetadata/v1/instance/preempted"
    assert infos["iowa"].machine["project"] == gcp.project and infos["iowa"].python == "/usr/bin/python3"


def test_a_syncer_in_another_cloud_is_reached_where_that_cloud_said(gcp: GcpCloud) -> None:
    infos = GcpProvider().bootstrap(RUN, [IOWA], "virginia", "100.100.0.9")
    assert infos["iowa"].syncer_host == "100.100.0.9" and gcp.addresses() == []
    assert set(rules(gcp)) == {"ddctl-r1-ssh", "ddctl-r1-internal"}  # no syncer here: no syncer rule
    with pytest.raises(DdctlError, match="its address is unknown"):
        GcpProvider().bootstrap(RUN, [IOWA], "virginia")


def test_one_project_per_run_and_a_missing_network_is_the_files_fault(gcp: GcpCloud) -> None:
    other = IOWA.model_copy(update={"name": "other", "project": "somebody-else"})
    with pytest.raises(DdctlError, match="must share a project"):
        GcpProvider().bootstrap(RUN, [IOWA, other], "iowa")
    with pytest.raises(ProvisionError) as refused:
        GcpProvider().bootstrap(RUN, [IOWA.model_copy(update={"vpc": "nowhere"})], "iowa")
    assert refused.value.kind == "config" and "nowhere" in str(refused.value)


def test_create_falls_to_the_next_machine_type_then_gives_the_zone_up(booted: GcpCloud) -> None:
    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    booted.fail_operation("instances.insert", gcp_shapes.ZONE_EXHAUSTED, zone="us-central1-a", times=1)
    made = provider.create(spec_of(infos, "L0", IOWA, zone="us-central1-a"))
    tried = [c.body["machineType"] for c in booted.calls("instances.insert") if c.body]
    assert [t.rsplit("/", 1)[1] for t in tried] == ["g2-standard-4", "g2-standard-8"]
    (vm,) = booted.instances()
    assert vm["machineType"].endswith("/g2-standard-8") and vm["scheduling"]["provisioningModel"] == "SPOT"
    assert vm["scheduling"]["instanceTerminationAction"] == "DELETE" and vm["labels"]["ddctl-run"] == RUN
    assert made.address == vm["networkInterfaces"][0]["accessConfigs"][0]["natIP"] and made.zone == "us-central1-a"
    assert f"{made.address} ssh-ed25519 " in RunDir(RUN).known_hosts.read_text()  # its host key is pinned
    assert [i.name for i in provider.list_run(RUN)] == ["L0"] and provider.list_run(RUN)[0].alive

    booted.fail_operation("instances.insert", gcp_shapes.ZONE_EXHAUSTED, zone="us-central1-a", times=None)
    with pytest.raises(ProvisionError) as refused:
        provider.create(spec_of(infos, "L1", IOWA, zone="us-central1-a"))
    assert (refused.value.kind, refused.value.scope, refused.value.zone) == ("capacity", "zone", "us-central1-a")
    assert len(booted.instances()) == 1  # a refused insert made nothing


@pytest.mark.parametrize(
    ("fault", "kind", "scope"),
    [
        ({"operation": gcp_shapes.QUOTA_EXCEEDED_REGION}, "quota", "region"),
        ({"operation": gcp_shapes.GPUS_ALL_REGIONS}, "quota", "cloud"),
        ({"status": 403, "reason": "quotaExceeded", "message": "Quota 'NVIDIA_L4_GPUS' exceeded. Limit: 0.0 in region x."},
         "quota", "region"),
        ({"status": 403, "reason": "forbidden"}, "credentials", "cloud"),
        ({"status": 403, "reason": "rateLimitExceeded", "message": "RESOURCE_OPERATION_RATE_EXCEEDED"}, "transient", "region"),
    ],
)  # fmt: skip
def test_a_refused_insert_is_classified_in_either_shape(booted: GcpCloud, fault: dict[str, Any], kind: str, scope: str) -> None:
    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    if "operation" in fault:
        booted.fail_operation("instances.insert", fault["operation"], times=None)
    else:
        booted.fail("instances.insert", times=None, **fault)
    with pytest.raises(ProvisionError) as refused:
        provider.create(spec_of(infos, "L0", IOWA, zone="us-central1-a"))
    assert (refused.value.kind, refused.value.scope, refused.value.provider) == (kind, scope, "gcp")
    assert booted.instances() == []
    if kind == "credentials":
        assert "anonymous, against DDCTL_GCP_ENDPOINT" in str(refused.value)


def test_the_syncer_is_standard_at_its_reserved_address(booted: GcpCloud) -> None:
    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    made = provider.create(spec_of(infos, "syncer", IOWA, role="syncer"))
    (vm,) = booted.instances()
    assert vm["scheduling"]["provisioningModel"] == "STANDARD" and made.address == infos["iowa"].syncer_host
    assert vm["scheduling"]["onHostMaintenance"] == "TERMINATE"  # a g2 carries an L4: GCE cannot live-migrate it
    assert vm["tags"]["items"] == ["ddctl-r1", "ddctl-r1-syncer"]


def test_the_syncers_port_follows_the_learners_and_leaves_the_operator_open(booted: GcpCloud) -> None:
    provider = GcpProvider()
    provider.bootstrap(RUN, [IOWA], "iowa")
    provider.admit(RUN, {"L0": "100.100.0.5", "L1": "100.100.192.77"})
    assert set(rules(booted)["ddctl-r1-syncer"]["sourceRanges"]) == {OPERATOR, "100.100.0.5/32", "100.100.192.77/32"}
    provider.admit(RUN, {"L1": "100.100.192.78"})  # L0 gone, L1 replaced at a new address
    assert set(rules(booted)["ddctl-r1-syncer"]["sourceRanges"]) == {OPERATOR, "100.100.192.78/32"}
    patches = len(booted.calls("firewalls.patch"))
    provider.admit(RUN, {"L1": "100.100.192.78"})
    assert len(booted.calls("firewalls.patch")) == patches  # nothing changed: nothing sent
    booted.reset()
    GcpProvider().bootstrap(RUN, [IOWA], "virginia", "100.100.0.9")
    GcpProvider().admit(RUN, {"L0": "100.100.0.5"})  # the syncer is in another cloud: nothing to open here
    assert set(rules(booted)) == {"ddctl-r1-ssh", "ddctl-r1-internal"}


def test_down_leaves_nothing_and_orphans_are_swept_by_label(booted: GcpCloud) -> None:
    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    provider.create(spec_of(infos, "syncer", IOWA, role="syncer"))
    provider.create(spec_of(infos, "L0", IOWA))
    for instance in provider.list_run(RUN):
        provider.terminate(instance, grace_s=0.0)
    removed = provider.cleanup(RUN)
    assert booted.instances() == [] and booted.firewalls() == [] and booted.addresses() == []
    assert {kind for kind, _ in removed} == {"firewall", "address"}
    assert sorted(name for kind, name in removed if kind == "firewall") == [
        f"{booted.project}/ddctl-r1-{rule}" for rule in ("internal", "ssh", "syncer")
    ]

    for run in ("dead", "alive"):
        infos = provider.bootstrap(run, [IOWA], "iowa")
        provider.create(InstanceSpec(run=run, name="L0", region="iowa", role="learner", argv=("x",), log=RunDir(run).log("L0"),
                                     cloud_region="us-central1", machine=infos["iowa"].machine))  # fmt: skip
    swept = provider.sweep([IOWA], live={"alive"}, now=0.0)
    assert [what for what, _ in swept if what == "instance"] == ["instance"] and any("dead" in name for _, name in swept)
    assert [i["labels"]["ddctl-run"] for i in booted.instances()] == ["alive"]
    assert {f["name"] for f in booted.firewalls()} == {"ddctl-alive-ssh", "ddctl-alive-syncer", "ddctl-alive-internal"}
    later = provider.sweep([IOWA], live=set(), now=10.0**12)  # past every expiry: nothing is spared
    assert booted.instances() == [] and booted.firewalls() == [] and any(w == "instance" for w, _ in later)


def test_the_runs_vms_reach_each_other_on_every_tcp_port_by_tag_and_only_they_do(gcp: GcpCloud) -> None:
    GcpProvider().bootstrap(RUN, [IOWA], "iowa")
    internal = rules(gcp)["ddctl-r1-internal"]
    assert internal["direction"] == "INGRESS" and internal["network"].endswith("/global/networks/default")
    assert internal["allowed"] == [{"IPProtocol": "tcp"}]  # no ports: every port
    assert internal["sourceTags"] == internal["targetTags"] == ["ddctl-r1"]  # from the run's VMs, to the run's VMs
    assert "sourceRanges" not in internal  # and from no address range: nothing outside the run
    assert internal["description"].endswith("(ddctl run r1)")  # what the orphan sweep reads the run from
    for name, rule in rules(gcp).items():
        if name != "ddctl-r1-internal":
            assert "sourceTags" not in rule and all(a.get("ports") for a in rule["allowed"])  # the others: one port each


def test_a_dead_runs_internal_rule_alone_is_found_by_the_orphan_sweep(booted: GcpCloud) -> None:
    provider = GcpProvider()
    provider.bootstrap("dead", [IOWA], "iowa")
    firewalls = booted.client("FirewallsClient")
    for name in ("ddctl-dead-ssh", "ddctl-dead-syncer"):  # a cleanup cut short: only the internal rule is left
        firewalls.delete_unary(project=booted.project, firewall=name)  # done at once: the fake has no delay here
    assert set(rules(booted)) == {"ddctl-dead-internal"}
    swept = provider.sweep([IOWA], live=set(), now=0.0)
    assert ("firewall", f"{booted.project}/ddctl-dead-internal") in swept and booted.firewalls() == []


def test_create_and_list_run_say_where_the_runs_other_vms_reach_an_instance(booted: GcpCloud) -> None:
    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    made = [provider.create(spec_of(infos, name, IOWA, role=role)) for name, role in (("syncer", "syncer"), ("L0", "learner"))]
    for instance in made:
        vm = booted.instance(*instance.provider_id.split("/"))
        assert vm is not None and instance.private_address == vm["networkInterfaces"][0]["networkIP"] != instance.address
        assert ipaddress.IPv4Address(instance.private_address) in gcp_shapes.INTERNAL_POOL  # the default network's range
    assert made[0].private_address != made[1].private_address
    listed = {i.name: i.private_address for i in provider.list_run(RUN)}
    assert listed == {i.name: i.private_address for i in made}


def test_an_instance_without_its_pinned_host_key_is_never_connected_to(booted: GcpCloud) -> None:
    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    made = provider.create(spec_of(infos, "L0", IOWA))
    assert provider.ssh_target(made).host == made.address
    zone, name = made.provider_id.split("/")
    instances = booted.client("InstancesClient")
    current = instances.get(project=booted.project, zone=zone, instance=name)
    items = [i for i in current.metadata.items if i.key != "ddctl-host-key"]
    current.metadata.items.clear()
    current.metadata.items.extend(items)
    instances.set_metadata_unary(project=booted.project, zone=zone, instance=name, metadata_resource=current.metadata)
    with pytest.raises(DdctlError, match="no ddctl-host-key"):
        provider.ssh_target(made)


def test_every_call_has_a_deadline_and_every_read_its_own_retry(booted: GcpCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library retries a 503 on get/list for 600 s (``timeout=`` bounds one attempt, not the retry): every call ddctl
    makes says how long, and every read brings a retry policy bounded by that."""
    seen: list[tuple[str, bool]] = []
    real = Clients.client

    def recording(self: Clients, name: str) -> Any:
        client = real(self, name)

        class Spy:
            def __getattr__(self, method: str) -> Any:
                call = getattr(client, method)

                def wrapped(*args: Any, **kwargs: Any) -> Any:
                    read = method in ("get", "list", "aggregated_list", "get_serial_port_output")
                    seen.append((f"{name}.{method}", "timeout" in kwargs and (not read or kwargs.get("retry") is not None)))
                    return call(*args, **kwargs)

                return wrapped

        return Spy()

    monkeypatch.setattr(Clients, "client", recording)
    monkeypatch.setattr(booted, "op_delay_s", 0.3)  # operations take a while: ddctl waits on them with its own client
    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    made = provider.create(spec_of(infos, "L0", IOWA))
    provider.list_run(RUN)
    provider.admit(RUN, {"L0": made.address})
    provider.terminate(made, grace_s=0.0)
    provider.cleanup(RUN)
    assert seen and all(timed for _, timed in seen), [call for call, timed in seen if not timed]
    assert {"InstancesClient.get", "InstancesClient.aggregated_list", "ZoneOperationsClient.wait"} <= {c for c, _ in seen}


def test_a_503_storm_on_reads_ends_in_a_transient_refusal_within_the_deadline(
    booted: GcpCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddctl.providers.gcp import clients as gcp_clients

    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    made = provider.create(spec_of(infos, "L0", IOWA))
    monkeypatch.setattr(gcp_clients, "CALL_TIMEOUT_S", 6.0)  # room for a retry on a loaded machine
    booted.fail("instances.aggregatedList", status=503, reason="backendError", times=None)
    started = time.monotonic()
    with pytest.raises(Exception) as storm:
        provider.list_run(RUN)
    assert time.monotonic() - started < 30  # the library alone would go on for 600 s
    assert provider.classify(storm.value).kind == "transient"
    assert len(booted.calls("instances.aggregatedList")) >= 2  # it was retried, backed off, before giving up
    booted.clear()
    assert [i.name for i in provider.list_run(RUN)] == ["L0"] and made.name == "L0"


def test_down_orphans_cleans_both_clouds_of_a_mixed_file(
    booted: GcpCloud, aws: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A forgotten run that spanned AWS and GCP: ``down --orphans -f FILE`` removes its VMs and networks in both."""
    import json

    from typer.testing import CliRunner

    from ddctl.cli.app import app
    from ddctl.providers.aws import provider as aws_provider
    from ddctl.providers.aws.provider import AwsProvider

    machines_that_would_answer(monkeypatch, aws_provider)
    virginia = Region(name="virginia", provider="aws", cloud_region="us-east-1", instance_type="g5.xlarge",
                      image="ami-12c6146b", python="/usr/bin/python3")  # fmt: skip
    home = AwsProvider().bootstrap("forgotten", [virginia], "virginia")
    away = GcpProvider().bootstrap("forgotten", [IOWA], "virginia", home["virginia"].syncer_host)
    for provider, infos, region in ((AwsProvider(), home, virginia), (GcpProvider(), away, IOWA)):
        spec = InstanceSpec(run="forgotten", name=f"L-{region.name}", region=region.name, role="learner", argv=("x",),
                            log=RunDir("forgotten").log("L"), cloud_region=region.cloud_region,
                            machine=infos[region.name].machine)  # fmt: skip
        provider.create(spec)
    assert len(booted.instances()) == 1 and booted.firewalls()
    regions = tmp_path / "mixed.yaml"
    regions.write_text(
        "run: other\nsyncer: virginia\nregions:\n"
        "  - {name: virginia, provider: aws, cloud_region: us-east-1, instance_type: g5.xlarge, image: ami-12c6146b}\n"
        "  - {name: iowa, provider: gcp, cloud_region: us-central1, instance_type: g2-standard-4}\n"
    )
    swept = CliRunner().invoke(app, ["down", "--orphans", "-f", str(regions), "--json"])
    assert swept.exit_code == 0, swept.output
    removed = json.loads(swept.stdout)["removed"]
    assert sorted(name.split("/")[1] for name in removed["instance"]) == ["forgotten", "forgotten"]  # one per cloud
    assert {"security group", "elastic ip", "firewall"} <= set(removed)
    assert booted.instances() == [] and booted.firewalls() == []
    ec2 = aws.client("ec2", "us-east-1")
    assert [
        i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"] if i["State"]["Name"] != "terminated"
    ] == []


def test_a_vm_that_powered_itself_off_is_read_from_its_serial_port_then_deleted(booted: GcpCloud) -> None:
    """Its exit summary (why it ended) and its log's tail come from serial port 1; retire collects them, then deletes it."""
    import base64

    provider = GcpProvider()
    infos = provider.bootstrap(RUN, [IOWA], "iowa")
    made = provider.create(spec_of(infos, "L0", IOWA))
    zone, name = made.provider_id.split("/")
    summary = b'{"reason": "preemption_notice", "drained": true}'
    booted.set_console(zone, name, f"ddctl-file /opt/ddctl/summary.json {base64.b64encode(summary).decode()}\nstep 40 loss 3.1\n")
    booted.set_status(zone, name, "TERMINATED")  # the power-off hook ran: GCE keeps a stopped VM and its console
    (ended,) = provider.list_run(RUN)
    assert not ended.alive
    assert provider.read_file(ended, "/opt/ddctl/summary.json") == summary
    assert provider.read_file(ended, "/opt/ddctl/agent.exit") is None
    provider.retire(ended, RunDir(RUN).log("L0"))
    assert "step 40 loss 3.1" in RunDir(RUN).log("L0").read_text() and "ddctl-file" not in RunDir(RUN).log("L0").read_text()
    assert booted.instances() == [] and provider.list_run(RUN) == []


def test_a_footprint_file_that_is_not_ours_is_read_as_nothing(gcp: GcpCloud) -> None:
    """The run directory's record of the project: torn, edited or of the wrong shape, it never names a project."""
    from ddctl.providers.gcp import network

    network.remember(RUN, "p1", "us-central1")
    assert network.project_of(RUN) == "p1" and network.footprint(RUN)["regions"] == ["us-central1"]
    path = RunDir(RUN).root / "gcp"
    for text in ('{"project": "p1", "regions": "us-central1"}', '{"project": 7, "regions": []}', '["p1"]', '{"proj', ""):
        path.write_text(text)
        assert network.footprint(RUN) == {} and network.project_of(RUN) == ""
    assert GcpProvider().list_run(RUN) == [] and GcpProvider().cleanup(RUN) == []

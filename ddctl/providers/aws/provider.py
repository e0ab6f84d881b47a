"""The ``aws`` provider: learners on EC2 spot, the syncer on-demand behind its Elastic IP, all found by tags.

``bootstrap`` prepares each region (``network.py``) and tells every region's
learners the syncer's Elastic IP. ``create`` tries the region's instance types
in order in the placement's zone, failing fast on each (``clients.FAIL_FAST``):
a capacity refusal for every type is a zone-scoped ``ProvisionError`` and the
control plane's failover picks the next zone or region. Instances are
``REGION/INSTANCE-ID``, so every verb knows where to act; the regions a run
has used are remembered in its run directory so ``list_run`` and ``cleanup``
look everywhere it went. Spot interruptions for chaos are real FIS
experiments (``aws:ec2:send-spot-instance-interruptions``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddctl.control.rundir import RunDir
from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers import console, deploy
from ddctl.providers.aws import footprint, interruptions, network, orphans
from ddctl.providers.aws.clients import Clients
from ddctl.providers.aws.errors import CAPACITY, classify
from ddctl.providers.aws.machines import (
    DEFAULT_IMAGE_PARAMETER,
    HOST_KEY_TAG,
    LIVE_STATES,
    REGION_TAG,
    ROLE_TAG,
    Machine,
    instance_id,
    instances_of,
    launch_request,
    machine_settings,
    private_address,
    public_address,
    tag_map,
    tags,
)
from ddctl.providers.aws.network import Network
from ddctl.providers.base import NAME_LABEL, Instance, InstanceSpec, PreemptionNotice, RegionInfo, syncer_name
from ddctl.providers.firstboot import BOOT_TIMEOUT_S, DEFAULT_PYTHON, LIFETIME_S, POWER_OFF, first_boot, ssh_cidr
from ddctl.providers.firstboot import ready as _ready
from ddctl_agents.waiting import wait_until

if TYPE_CHECKING:
    from ddctl.config.regions import Region

SYNCER_PORT = 8443
NOTICE_URL = "http://169.254.169.254/latest/meta-data/spot/instance-action"
TERMINATE_TIMEOUT_S = 300.0


def split_id(provider_id: str) -> tuple[str, str]:
    region, _, ident = provider_id.partition("/")
    return region, ident


class AwsProvider:
    kind = "aws"
    power_off = POWER_OFF

    def __init__(self, clients: Clients | None = None) -> None:
        self.clients = clients or Clients()
        self._networks: dict[tuple[str, str], Network] = {}

    def ec2(self, region: str, *, fail_fast: bool = False) -> Any:
        return self.clients.client("ec2", region, fail_fast=fail_fast)

    # -- regions ------------------------------------------------------------------------------
    def bootstrap(
        self, run: str, regions: list[Region], syncer_region: str = "", syncer_host: str = "", shard_regions: tuple[str, ...] = ()
    ) -> dict[str, RegionInfo]:
        """Each region's network, and the syncer's Elastic IP where it runs here (else ``syncer_host``), or one for each
        shard here (``shard_regions``); idempotent."""
        here = {r.name: r for r in regions}
        if syncer_region not in here and not syncer_host:
            raise DdctlError(f"the syncer's region {syncer_region!r} is elsewhere and its address is unknown yet")
        shards = shard_regions or (syncer_region,)
        ssh_from = ssh_cidr()
        try:
            for region in regions:
                self.network(run, region.cloud_region, ssh_from, vpc=region.vpc)
            hosts = tuple(
                network.ensure_address(self.ec2(here[name].cloud_region), run, syncer_name(i))[1] if name in here else ""
                for i, name in enumerate(shards)
            )
        except Exception as exc:
            raise self.classify(exc) from None
        homes = sorted({here[name].cloud_region for name in shards if name in here})
        return {
            r.name: RegionInfo(
                region=r.name, provider=self.kind, python=r.python or DEFAULT_PYTHON, remote=True,
                syncer_host=hosts[0] or syncer_host, syncer_port=SYNCER_PORT, notice_url=NOTICE_URL,
                machine=machine_settings(r, homes, ssh_from), shard_hosts=hosts if shard_regions else (),
            )
            for r in regions
        }  # fmt: skip

    def network(self, run: str, region: str, ssh_from: str, vpc: str = "") -> Network:
        """The run's network in ``region`` (made on first use: a failover region is prepared here)."""
        if (run, region) not in self._networks:
            ec2 = self.ec2(region)
            vpc_id = network.find_vpc(ec2, region, vpc)
            subnets = network.zone_subnets(ec2, vpc_id)
            group = network.ensure_security_group(ec2, run, vpc_id, ssh_from, SYNCER_PORT)
            key = network.ensure_key_pair(ec2, run, deploy.ensure_client_key(RunDir(run).ssh_key))
            self._networks[(run, region)] = Network(region, vpc_id, subnets, group, key)
            footprint.remember(run, region)
        return self._networks[(run, region)]

    # -- instances ----------------------------------------------------------------------------
    def create(self, spec: InstanceSpec) -> Instance:
        """Run the instance (each instance type in turn), give the syncer its address, return once SSH answers."""
        settings = spec.machine
        region = spec.cloud_region
        if not region or not settings:
            raise DdctlError(f"{spec.name}: an aws instance needs its cloud region and machine settings (bootstrap first)")
        net = self.network(spec.run, region, str(settings["ssh_from"]), vpc=str(settings.get("vpc", "")))
        zone = spec.zone or next(iter(net.subnets), "")
        if zone not in net.subnets:
            raise ProvisionError(
                f"aws {region}: zone {zone!r} has no subnet in {net.vpc}; zones: {', '.join(net.subnets)}",
                kind="config", scope="zone", code="NoSubnet", provider=self.kind, region=region, zone=zone,
            )  # fmt: skip
        rundir = RunDir(spec.run)
        host_private, host_public = deploy.new_keypair()
        client_public = deploy.ensure_client_key(rundir.ssh_key)
        machine = Machine(
            image=self.image(region, str(settings.get("image", ""))),
            python=str(settings["python"]),
            spot=bool(settings.get("spot", True)) and spec.role == "learner",
            max_price=settings.get("max_price"),
        )
        script = first_boot(host_private, host_public, client_public, machine.python)
        labels = tags(spec, host_public, time.time() + LIFETIME_S)
        ident = self._run_instance(spec, machine, list(settings["instance_types"]), net, zone, script, labels)
        provider_id = f"{region}/{ident}"
        try:
            address, private = self._bring_up(spec, provider_id, settings)
            with rundir.known_hosts.open("a") as pinned:
                pinned.write(deploy.known_hosts_line(deploy.Target(address, host_public, rundir.ssh_key)) + "\n")
            target = deploy.Target(address, host_public, rundir.ssh_key)
            wait_until(lambda: _ready(target), timeout_s=BOOT_TIMEOUT_S, every_s=1.0, what=f"first boot of {spec.name}")
        except BaseException:
            with contextlib.suppress(Exception):
                self.ec2(region).terminate_instances(InstanceIds=[ident])
            raise
        return Instance(
            name=spec.name, provider_id=provider_id, run=spec.run, alive=True, address=address, zone=zone,
            private_address=private,
        )  # fmt: skip

    def image(self, region: str, image: str) -> str:
        """The AMI: the file's id, or the id a public SSM parameter names (``ssm:/aws/service/...``)."""
        if image.startswith("ami-"):
            return image
        name = image.removeprefix("ssm:") or DEFAULT_IMAGE_PARAMETER
        try:
            return str(self.clients.client("ssm", region).get_parameter(Name=name)["Parameter"]["Value"])
        except Exception as exc:
            raise self.classify(exc, region=region) from None

    def _run_instance(
        self,
        spec: InstanceSpec,
        machine: Machine,
        types: list[str],
        net: Network,
        zone: str,
        script: str,
        labels: dict[str, str],
    ) -> str:
        """``RunInstances`` with each preferred type until one has capacity; the last refusal if none has."""
        ec2 = self.ec2(net.region, fail_fast=True)
        refusal: ProvisionError | None = None
        for instance_type in types:
            request = launch_request(
                spec, machine, instance_type=instance_type, subnet=net.subnets[zone], security_group=net.security_group,
                key_name=net.key_name, user_data=script, tags=labels,
            )  # fmt: skip
            try:
                answered = ec2.run_instances(**request)["Instances"][0]["InstanceId"]
            except Exception as exc:
                refusal = self.classify(exc, region=net.region, zone=zone)
                if refusal.code not in CAPACITY:
                    raise refusal from None
                continue
            return instance_id(answered)
        raise refusal or ProvisionError(
            f"aws {net.region}: no instance type to try", kind="config", scope="region", provider=self.kind, region=net.region
        )

    def _bring_up(self, spec: InstanceSpec, provider_id: str, settings: dict[str, Any]) -> tuple[str, str]:
        """Wait until running with a public address (the syncer's Elastic IP), open the syncer port to a learner.

        Returns (public, private) addresses."""
        region, ident = split_id(provider_id)
        ec2 = self.ec2(region)
        if spec.role == "syncer":
            allocation, _ = network.ensure_address(ec2, spec.run, spec.name)
            wait_until(lambda: self._state(region, ident) == "running", timeout_s=BOOT_TIMEOUT_S, what=f"{spec.name} to run")
            ec2.associate_address(AllocationId=allocation, InstanceId=ident, AllowReassociation=True)
        public, private = wait_until(
            lambda: self._addresses(region, ident), timeout_s=BOOT_TIMEOUT_S, every_s=0.5,
            what=f"a public address of {spec.name}",
        )  # fmt: skip
        homes = settings.get("syncer_regions", [settings.get("syncer_region")])  # a spec an older ddctl stored: one region
        for home in [h for h in homes if h] if spec.role == "learner" else ():  # none: the syncer is in another cloud
            group = self.network(spec.run, home, str(settings["ssh_from"])).security_group
            network.allow(self.ec2(home), group, SYNCER_PORT, f"{public}/32", f"learner {spec.name}")
        return public, private

    def _addresses(self, region: str, ident: str) -> tuple[str, str] | None:
        """(public, private) once EC2 describes a public address ("" for a private one that is none)."""
        raw = next(iter(self.describe(region, [ident])), {})
        public = public_address(raw)
        return (public, private_address(raw)) if public else None

    def describe(self, region: str, ids: list[str] | None = None, run: str = "") -> list[dict[str, Any]]:
        filters = network.run_filter(run) if run else []
        kwargs: dict[str, Any] = {"InstanceIds": ids} if ids else {"Filters": filters}
        return instances_of(self.ec2(region).get_paginator("describe_instances").paginate(**kwargs))

    def _state(self, region: str, ident: str) -> str:
        found = self.describe(region, [ident])
        return str(found[0]["State"]["Name"]) if found else "terminated"

    def list_run(self, run: str) -> list[Instance]:
        """Every instance tagged with ``run`` in every region the run used; an ended one until it is retired."""
        found = []
        done = footprint.retired(run)
        for region in footprint.regions(run):
            for raw in self.describe(region, run=run):
                state = raw["State"]["Name"]
                if state == "terminated" and raw["InstanceId"] in done:
                    continue
                found.append(
                    Instance(
                        name=tag_map(raw).get(NAME_LABEL, "?"),
                        provider_id=f"{region}/{raw['InstanceId']}",
                        run=run,
                        alive=state in LIVE_STATES,
                        address=public_address(raw) or "",
                        zone=str(raw.get("Placement", {}).get("AvailabilityZone", "")),
                        private_address=private_address(raw),
                    )
                )
        return sorted(found, key=lambda i: i.name)

    def ssh_target(self, instance: Instance) -> deploy.Target:
        region, ident = split_id(instance.provider_id)
        found = self.describe(region, [ident])
        address = public_address(found[0]) if found and found[0]["State"]["Name"] == "running" else None
        if address is None:
            raise DdctlError(f"{instance.name} is not running (or has no public address)")
        host_key = deploy.pinnable(tag_map(found[0]).get(HOST_KEY_TAG))
        if host_key is None:  # the pin ddctl tagged it with; without it nothing is trusted
            raise DdctlError(f"{instance.name} carries no {HOST_KEY_TAG} tag ddctl could pin; not connecting")
        return deploy.Target(address, host_key, RunDir(instance.run).ssh_key)

    def terminate(self, instance: Instance, grace_s: float = 10.0) -> None:
        """SIGTERM the agent (it pushes and leaves, the VM powers off), wait, then collect its log and terminate."""
        if instance.alive and grace_s > 0:
            with contextlib.suppress(DdctlError):
                deploy.run_command(self.ssh_target(instance), f"kill -TERM $(cat {deploy.REMOTE_ROOT}/agent.pid)", wait_s=5.0)
            region, ident = split_id(instance.provider_id)
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: self._state(region, ident) != "running", timeout_s=grace_s, what=f"{instance.name} to stop")
        self.retire(instance, RunDir(instance.run).log(instance.name))

    def preempt(self, instance: Instance, notice_s: float) -> None:
        """A real spot interruption through FIS: the IMDS notice now, the interruption ``notice_s`` later.

        Returns once the VM has stopped running (its agent left on the notice, or FIS interrupted it)."""
        region, ident = split_id(instance.provider_id)
        try:
            interruptions.interrupt(self.clients, region, instance.run, ident, notice_s)
        except Exception as exc:
            raise self.classify(exc, region=region) from None
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda: self._state(region, ident) != "running", timeout_s=notice_s + 60.0, every_s=0.5, what="the interruption"
            )

    def notices(self, run: str) -> list[PreemptionNotice]:
        """EC2 has no API that lists pending notices: a learner reads its own from IMDS and leaves in time."""
        return []

    def read_file(self, instance: Instance, path: str, limit: int | None = None) -> bytes | None:
        """A file of a running VM (over SSH), or of a gone one from its last words on the console; None if neither has it."""
        return console.read_file(lambda: self.ssh_target(instance), lambda: self._console(instance), path, limit)

    def _console(self, instance: Instance) -> str:
        """The VM's serial console as EC2 kept it ("" where there is none)."""
        region, ident = split_id(instance.provider_id)
        try:
            return str(self.ec2(region).get_console_output(InstanceId=ident, Latest=True).get("Output") or "")
        except Exception:  # noqa: BLE001 - no console is no last words, whatever the reason
            return ""

    def retire(self, instance: Instance, log: Path) -> None:
        """Append the agent's log to ``log`` (over SSH, or its tail from the console), close its port, terminate it."""
        console.collect_log(lambda: self.ssh_target(instance), lambda: self._console(instance), log, instance.provider_id)
        region, ident = split_id(instance.provider_id)
        found = self.describe(region, [ident])
        if found and found[0]["State"]["Name"] != "terminated":
            self.ec2(region).terminate_instances(InstanceIds=[ident])
            wait_until(
                lambda: self._state(region, ident) == "terminated",
                timeout_s=TERMINATE_TIMEOUT_S,
                every_s=2.0,
                what=f"{instance.name} ({ident}) to terminate",
            )
        self._close_port(instance.run, found[0] if found else {})
        footprint.mark_retired(instance.run, ident)

    def _close_port(self, run: str, raw: dict[str, Any]) -> None:
        """A learner's /32 rule on the syncer's port goes with it."""
        address = public_address(raw)
        if address is None or tag_map(raw).get(ROLE_TAG) != "learner":
            return
        for region in footprint.regions(run):
            for group in network.run_groups(self.ec2(region), run):
                network.revoke(self.ec2(region), group, SYNCER_PORT, f"{address}/32")

    def cleanup(self, run: str) -> list[tuple[str, str]]:
        """The run's Elastic IP, key pairs, security groups and FIS leftovers, in every region it used."""
        removed: list[tuple[str, str]] = []
        for region in footprint.regions(run):
            removed += network.remove_network(self.ec2(region), run)
            removed += interruptions.remove(self.clients, region, run)
        footprint.forget(run)
        self._networks = {k: v for k, v in self._networks.items() if k[0] != run}
        return removed

    def sweep(self, regions: list[Region], live: set[str], now: float) -> list[tuple[str, str]]:
        """Orphans (``orphans.py``) in the cloud regions these regions may use, removed; returns what went.

        ``live``: the runs this machine knows to be live; a run whose syncer VM runs is live wherever it was started."""
        removed: list[tuple[str, str]] = []
        clouds = sorted({c for r in regions for c in (r.cloud_region, *r.fallback_regions) if c})
        live = live | {run for c in clouds for run in orphans.training(self.ec2(c))}  # a run whose syncer runs is alive
        for cloud_region in clouds:
            ec2 = self.ec2(cloud_region)

            def terminate(ids: list[str], ec2: Any = ec2) -> None:
                ec2.terminate_instances(InstanceIds=ids)
                ec2.get_waiter("instance_terminated").wait(InstanceIds=ids, WaiterConfig={"Delay": 2, "MaxAttempts": 150})

            removed += orphans.sweep(ec2, live, now, terminate)
        return removed

    # -- the syncer's port, chaos and errors --------------------------------------------------
    def admit(self, run: str, learners: Mapping[str, str]) -> None:
        """Where the run's syncer (or a shard of it) is on EC2: its port open to the operator and exactly these learners'
        addresses, in each region that runs one."""
        for home, group in self._syncer_groups(run):  # none: the syncer runs in another cloud (or not yet)
            network.admit(self.ec2(home), group, SYNCER_PORT, {f"{a}/32" for a in learners.values()}, {ssh_cidr()})

    def cut_link(self, run: str, region: str) -> None:
        """Close the syncer's port to ``region``'s learners (their /32 rules go): a real partition on EC2."""
        for home, group in self._syncer_groups(run, required=True):
            for address in self._learner_addresses(run, region):
                network.revoke(self.ec2(home), group, SYNCER_PORT, f"{address}/32")

    def heal_link(self, run: str, region: str) -> None:
        for home, group in self._syncer_groups(run, required=True):
            for address in self._learner_addresses(run, region):
                network.allow(self.ec2(home), group, SYNCER_PORT, f"{address}/32", f"learner of {region}")

    def _learner_addresses(self, run: str, region: str) -> list[str]:
        return [
            address
            for cloud_region in footprint.regions(run)
            for raw in self.describe(cloud_region, run=run)
            if tag_map(raw).get(REGION_TAG) == region
            and tag_map(raw).get(ROLE_TAG) == "learner"
            and (address := public_address(raw)) is not None
        ]

    def _syncer_groups(self, run: str, *, required: bool = False) -> list[tuple[str, str]]:
        """(cloud region, security group) of each region where a synchronizer VM of the run (the syncer, or a shard) runs."""
        found = []
        for region in footprint.regions(run):
            raws = self.describe(region, run=run)
            if any(tag_map(raw).get(ROLE_TAG) == "syncer" and raw["State"]["Name"] == "running" for raw in raws):
                found += [(region, group) for group in network.run_groups(self.ec2(region), run)[:1]]
        if required and not found:
            raise DdctlError(f"run {run} has no running syncer on aws")
        return found

    def classify(self, error: Exception, *, region: str = "", zone: str = "") -> ProvisionError:
        return classify(error, region=region, zone=zone, credentials=self.clients.described)

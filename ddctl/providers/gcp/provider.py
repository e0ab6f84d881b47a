"""The ``gcp`` provider: learners on Compute Engine SPOT VMs, the syncer standard behind its reserved address.

``bootstrap`` checks the VPC network, opens SSH, every TCP port between the
run's VMs (a learner's nodes) and, where the syncer runs here, its port with
firewall rules on network tags, and reserves the syncer's address. ``create``
tries the region's machine types in order in the placement's zone; a zone out
of capacity for every type is a zone-scoped ``ProvisionError`` and the control
plane's failover picks the next zone or region. Instances are ``ZONE/NAME``;
every read is found by label, checked against the exact names in the metadata,
and bounded in time (``clients.py``).
Spot interruptions for chaos are ``simulateMaintenanceEvent``: GCE's ~30 s
preemption, which the learner reads from ``instance/preempted``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddctl.control.rundir import RunDir
from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers import console, deploy
from ddctl.providers.base import NAME_LABEL, Instance, InstanceSpec, PreemptionNotice, RegionInfo, syncer_name
from ddctl.providers.firstboot import BOOT_TIMEOUT_S, DEFAULT_PYTHON, LIFETIME_S, POWER_OFF, first_boot, ssh_cidr
from ddctl.providers.firstboot import ready as _ready
from ddctl.providers.gcp import listing, network
from ddctl.providers.gcp.clients import CALL_TIMEOUT_S, Clients
from ddctl.providers.gcp.errors import CAPACITY, classify, http_status
from ddctl.providers.gcp.machines import (
    LIVE_STATES,
    Machine,
    host_key,
    insert_body,
    instance_name,
    items,
    machine_settings,
    metadata_items,
    private_address,
    public_address,
    region_of,
    zone_of,
)
from ddctl_agents.waiting import wait_until

if TYPE_CHECKING:
    from ddctl.config.regions import Region

SYNCER_PORT = 8443
NOTICE_URL = "http://169.254.169.254/computeMetadata/v1/instance/preempted"


def split_id(provider_id: str) -> tuple[str, str]:
    zone, _, name = provider_id.partition("/")
    return zone, name


class GcpProvider:
    kind = "gcp"
    power_off = POWER_OFF

    def __init__(self, clients: Clients | None = None) -> None:
        self.clients = clients or Clients()

    @property
    def instances(self) -> Any:
        return self.clients.client("InstancesClient")

    # -- regions ------------------------------------------------------------------------------
    def bootstrap(
        self, run: str, regions: list[Region], syncer_region: str = "", syncer_host: str = "", shard_regions: tuple[str, ...] = ()
    ) -> dict[str, RegionInfo]:
        """Check the network, open SSH and the run's VMs to each other (and, where the syncer or a shard runs here, its
        port), reserve its address (each shard's: ``shard_regions``); idempotent."""
        projects = {self.clients.project(r.project) for r in regions}
        if len(projects) != 1:
            raise DdctlError(f"the gcp regions of one run must share a project; they name {', '.join(sorted(projects))}")
        project = projects.pop()
        here = {r.name: r for r in regions}
        shards = shard_regions or (syncer_region,)
        ssh_from = ssh_cidr()
        syncers = any(name in here for name in shards)  # the syncer or a shard runs here: its port's rule
        try:
            for net in sorted({r.vpc or "default" for r in regions}):
                network.check_network(self.clients, project, net)
                network.ensure_firewalls(self.clients, project, run, net, ssh_from, SYNCER_PORT, syncer=syncers)
            hosts = []
            for i, name in enumerate(shards):
                cloud = here[name].cloud_region if name in here else ""
                if cloud:
                    network.remember(run, project, cloud)
                hosts.append(network.ensure_address(self.clients, project, cloud, run, syncer_name(i)) if cloud else "")
        except Exception as exc:
            raise self.classify(exc) from None
        syncer_host = hosts[0] or syncer_host
        if not syncer_host:
            raise DdctlError(f"the syncer's region {syncer_region!r} is elsewhere and its address is unknown yet")
        for region in regions:
            network.remember(run, project, region.cloud_region)
        return {
            r.name: RegionInfo(
                region=r.name, provider=self.kind, python=r.python or DEFAULT_PYTHON, remote=True, syncer_host=syncer_host,
                syncer_port=SYNCER_PORT, notice_url=NOTICE_URL, shard_hosts=tuple(hosts) if shard_regions else (),
                machine=machine_settings(r, project, ssh_from),
            )
            for r in regions
        }  # fmt: skip

    # -- instances ----------------------------------------------------------------------------
    def create(self, spec: InstanceSpec) -> Instance:
        """Insert the instance (each machine type in turn), wait until it runs and SSH answers with the pinned key."""
        settings = spec.machine
        if not spec.cloud_region or not settings:
            raise DdctlError(f"{spec.name}: a gcp instance needs its cloud region and machine settings (bootstrap first)")
        project = str(settings["project"])
        zone = spec.zone or self.zones(project, spec.cloud_region, list(settings.get("zones", [])))[0]
        network.remember(spec.run, project, region_of(zone))
        rundir = RunDir(spec.run)
        host_private, host_public = deploy.new_keypair()
        client_public = deploy.ensure_client_key(rundir.ssh_key)
        machine = Machine(
            project=project, image=str(settings.get("image", "")), python=str(settings["python"]),
            spot=bool(settings.get("spot", True)), network=str(settings.get("network", "default")),
            disk_gb=int(settings.get("disk_gb", 50)), accelerator=str(settings.get("accelerator", "")),
            accelerator_count=int(settings.get("accelerator_count", 1)),
        )  # fmt: skip
        syncer = spec.role == "syncer"
        address = network.ensure_address(self.clients, project, region_of(zone), spec.run, spec.name) if syncer else ""
        script = first_boot(host_private, host_public, client_public, machine.python)
        metadata = metadata_items(spec, host_public, client_public, script)
        name = self._insert(spec, machine, list(settings["instance_types"]), zone, metadata, address)
        provider_id = f"{zone}/{name}"
        try:
            public, private = wait_until(
                lambda: self._running_addresses(project, zone, name), timeout_s=BOOT_TIMEOUT_S, every_s=0.5,
                what=f"{spec.name} to run with an external address",
            )  # fmt: skip
            target = deploy.Target(public, host_public, rundir.ssh_key)
            with rundir.known_hosts.open("a") as pinned:
                pinned.write(deploy.known_hosts_line(target) + "\n")
            wait_until(lambda: _ready(target), timeout_s=BOOT_TIMEOUT_S, every_s=1.0, what=f"first boot of {spec.name}")
        except BaseException:
            with contextlib.suppress(Exception):
                self.instances.delete_unary(project=project, zone=zone, instance=name, timeout=CALL_TIMEOUT_S)
            raise
        return Instance(
            name=spec.name, provider_id=provider_id, run=spec.run, alive=True, address=public, zone=zone,
            private_address=private,
        )  # fmt: skip

    def zones(self, project: str, region: str, chosen: list[str]) -> list[str]:
        """The file's zones, else the region's zones that are UP (as GCE lists them)."""
        if chosen:
            return chosen
        try:
            listed = self.clients.client("ZonesClient").list(project=project, **self.clients.read)
            found = sorted(str(z.name) for z in listed if str(z.region).endswith(f"/{region}") and str(z.status) == "UP")
        except Exception as exc:
            raise self.classify(exc, region=region) from None
        if not found:
            raise ProvisionError(
                f"gcp {region}: no zone is up (or the region does not exist)", kind="config", scope="region",
                code="NoZone", provider=self.kind, region=region,
            )  # fmt: skip
        return found

    def _insert(
        self, spec: InstanceSpec, machine: Machine, types: list[str], zone: str, metadata: dict[str, str], address: str
    ) -> str:
        """``instances.insert`` with each preferred machine type until one has capacity; the last refusal if none has."""
        from google.cloud import compute_v1

        refusal: ProvisionError | None = None
        for machine_type in types:
            name = instance_name(spec)
            body = insert_body(
                spec, machine, name=name, zone=zone, machine_type=machine_type, metadata=metadata,
                expires_at=time.time() + LIFETIME_S, address=address,
            )  # fmt: skip
            try:
                op = self.instances.insert_unary(
                    project=machine.project, zone=zone, instance_resource=compute_v1.Instance.from_json(json.dumps(body)),
                    timeout=CALL_TIMEOUT_S,
                )  # fmt: skip
                self.clients.wait(op, machine.project, zone=zone)
                return name
            except Exception as exc:
                refusal = self.classify(exc, region=region_of(zone), zone=zone)
                if refusal.code not in CAPACITY:
                    raise refusal from None
        raise refusal or ProvisionError(
            f"gcp {zone}: no machine type to try", kind="config", scope="region", provider=self.kind, region=region_of(zone)
        )

    def _get(self, project: str, zone: str, name: str) -> Any | None:
        """The instance now (None once gone); a refused read is a ProvisionError naming it (``listing.get``)."""
        return listing.get(self.clients, project, zone, name)

    def _running_addresses(self, project: str, zone: str, name: str) -> tuple[str, str] | None:
        """(external, internal) addresses once the VM runs with an external one ("" for an internal one that is none)."""
        raw = self._get(project, zone, name)
        if raw is None:
            raise DdctlError(f"{name} in {zone} is gone before it ran (preempted at once?)")
        public = public_address(raw) if str(raw.status) == "RUNNING" else None
        return (public, private_address(raw)) if public else None

    def listed(self, run: str) -> list[Any]:
        """Every instance of ``run`` (found by label, kept when its metadata names the run exactly)."""
        project = network.project_of(run)
        return listing.of_run(self.clients, project, run) if project else []

    def list_run(self, run: str) -> list[Instance]:
        """Every instance of the run; a stopped one (its agent ended) until it is retired."""
        return sorted(
            (
                Instance(
                    name=items(raw).get(NAME_LABEL, "?"),
                    provider_id=f"{zone_of(raw)}/{raw.name}",
                    run=run,
                    alive=str(raw.status) in LIVE_STATES,
                    address=public_address(raw) or "",
                    zone=zone_of(raw),
                    private_address=private_address(raw),
                )  # fmt: skip
                for raw in self.listed(run)
            ),
            key=lambda i: i.name,
        )

    def _raw(self, instance: Instance) -> Any | None:
        zone, name = split_id(instance.provider_id)
        return self._get(network.project_of(instance.run), zone, name)

    def ssh_target(self, instance: Instance) -> deploy.Target:
        raw = self._raw(instance)
        address = public_address(raw) if raw is not None and str(raw.status) == "RUNNING" else None
        if address is None:
            raise DdctlError(f"{instance.name} is not running (or has no external address)")
        key = host_key(raw)
        if key is None:  # the pin ddctl put in the metadata; without it nothing is trusted
            raise DdctlError(f"{instance.name} carries no ddctl-host-key ddctl could pin; not connecting")
        return deploy.Target(address, key, RunDir(instance.run).ssh_key)

    def terminate(self, instance: Instance, grace_s: float = 10.0) -> None:
        """SIGTERM the agent (it pushes and leaves, the VM powers off), wait, then collect its log and delete it."""
        if instance.alive and grace_s > 0:
            with contextlib.suppress(DdctlError):
                deploy.run_command(self.ssh_target(instance), f"kill -TERM $(cat {deploy.REMOTE_ROOT}/agent.pid)", wait_s=5.0)
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: not self._alive(instance), timeout_s=grace_s, what=f"{instance.name} to stop")
        self.retire(instance, RunDir(instance.run).log(instance.name))

    def _alive(self, instance: Instance) -> bool:
        raw = self._raw(instance)
        return raw is not None and str(raw.status) in LIVE_STATES

    def preempt(self, instance: Instance, notice_s: float) -> None:
        """A real preemption: ``simulateMaintenanceEvent`` on a SPOT VM (GCE gives ~30 s; ``notice_s`` is not GCE's to set).

        Returns once the VM has stopped running (its agent left on the notice, or GCE preempted it)."""
        zone, name = split_id(instance.provider_id)
        project = network.project_of(instance.run)
        try:
            op = self.instances.simulate_maintenance_event_unary(
                project=project, zone=zone, instance=name, timeout=CALL_TIMEOUT_S
            )
            self.clients.wait(op, project, zone=zone)
        except Exception as exc:
            raise self.classify(exc, region=region_of(zone), zone=zone) from None
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda: not self._alive(instance), timeout_s=max(notice_s, 30.0) + 60.0, every_s=0.5, what="the preemption"
            )

    def notices(self, run: str) -> list[PreemptionNotice]:
        """GCE has no API that lists pending preemptions: a learner reads its own from the metadata server."""
        return []

    def read_file(self, instance: Instance, path: str, limit: int | None = None) -> bytes | None:
        """A file of a running VM (over SSH), or of a stopped one from its last words on the serial port."""
        return console.read_file(lambda: self.ssh_target(instance), lambda: self._console(instance), path, limit)

    def _console(self, instance: Instance) -> str:
        """Serial port 1 as GCE keeps it for a stopped VM ("" for a deleted one, or when it cannot be read)."""
        zone, name = split_id(instance.provider_id)
        project = network.project_of(instance.run)
        try:
            out = self.instances.get_serial_port_output(project=project, zone=zone, instance=name, **self.clients.read)
        except Exception:  # noqa: BLE001 - no console is no last words, whatever the reason
            return ""
        return str(out.contents or "")

    def retire(self, instance: Instance, log: Path) -> None:
        """Append the agent's log to ``log`` (over SSH, or its tail from the serial port), then delete the VM."""
        console.collect_log(lambda: self.ssh_target(instance), lambda: self._console(instance), log, instance.provider_id)
        zone, name = split_id(instance.provider_id)
        project = network.project_of(instance.run)
        try:
            op = self.instances.delete_unary(project=project, zone=zone, instance=name, timeout=CALL_TIMEOUT_S)
            self.clients.wait(op, project, zone=zone)
        except Exception as exc:
            if http_status(exc) != 404:
                raise self.classify(exc, region=region_of(zone), zone=zone) from None

    def cleanup(self, run: str) -> list[tuple[str, str]]:
        """The run's firewall rules (SSH, internal, the syncer's) and reserved address."""
        known = network.footprint(run)
        if not known:
            return []
        project = str(known["project"])
        try:
            removed = network.remove_network(self.clients, project, run, known.get("regions", []))
        except Exception as exc:
            raise self.classify(exc, doing=f"removing the network of run {run} in project {project}") from None
        network.forget(run)
        return removed

    def sweep(self, regions: list[Region], live: set[str], now: float) -> list[tuple[str, str]]:
        """Instances whose run is not live (or past ``ddctl-expires-at``), then dead runs' firewalls and addresses."""
        from ddctl.providers.gcp import orphans

        projects = sorted({self.clients.project(r.project) for r in regions})
        clouds = sorted({c for r in regions for c in (r.cloud_region, *r.fallback_regions) if c})
        removed: list[tuple[str, str]] = []
        for project in projects:
            try:
                removed += orphans.sweep(self.clients, project, clouds, live, now)
            except Exception as exc:
                raise self.classify(exc, doing=f"sweeping orphans in project {project}") from None
        return removed

    # -- the syncer's port --------------------------------------------------------------------
    def admit(self, run: str, learners: Mapping[str, str]) -> None:
        """Where the run's syncer is on GCE: its port open to the operator and exactly these learners' addresses."""
        project = network.project_of(run)
        if not project:
            return
        doing = f"admitting learners to the syncer of run {run} in project {project}"
        try:
            current = network.admitted(self.clients, project, run)
        except Exception as exc:
            raise self.classify(exc, doing=doing) from None
        if current is None:
            return
        operator = {r for r in current if not r.endswith("/32")} | {ssh_cidr()}  # its DdctlError is the operator's to fix
        wanted = operator | {f"{address}/32" for address in learners.values()}
        if wanted != current:
            try:
                network.set_sources(self.clients, project, run, wanted)
            except Exception as exc:
                raise self.classify(exc, doing=doing) from None

    def cut_link(self, run: str, region: str) -> None:
        """Nothing to do here: the control plane's admission leaves a partitioned region's learners out of ``admit``."""

    def heal_link(self, run: str, region: str) -> None:
        """As ``cut_link``: admission lets the region back in."""

    def classify(self, error: Exception, *, region: str = "", zone: str = "", doing: str = "") -> ProvisionError:
        """``error`` as failover reads it; ``doing``, what was asked, for the message."""
        return classify(error, region=region, zone=zone, credentials=self.clients.described, doing=doing)

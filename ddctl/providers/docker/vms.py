"""The ``docker`` provider: every instance a container that behaves like a small VM.

``bootstrap`` gives each region a bridge network of its own and starts the
run's instance-metadata endpoint (spot notices). The syncer's container joins
every region's network at a fixed address (.250), so learners reach it across
their region's link and a replacement syncer comes back at the same address,
with its state on a "persistent disk" (a bind mount from the run directory).
``create`` boots a container, at an address the run never handed before as a
cloud's new VM is (``addresses.py``), with sshd, a host key ddctl made for it (pinned;
its public half is a container label) and the run's client key, shapes its link
(tc tbf on its eth0 for the uplink, on the host end of its veth for the
downlink), and returns once sshd answers: the agent is deployed over SSH by the
shared deploy, exactly as on a cloud VM. When the agent ends the container
powers off, so ``alive`` means "the agent runs". Labels carry the run, the
name, the region and the host key, so everything is found again with the state
file gone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddctl.control.rundir import RunDir
from ddctl.errors import DdctlError, EngineError, ProvisionError
from ddctl.providers import console, deploy, linkshape
from ddctl.providers.base import (
    NAME_LABEL,
    RUN_LABEL,
    Instance,
    InstanceSpec,
    PreemptionNotice,
    RegionInfo,
    dug,
    ipv4,
    syncer_index,
)
from ddctl.providers.docker import metadata
from ddctl.providers.docker.addresses import fresh_address
from ddctl.providers.docker.engine import Engine, tar_of
from ddctl.providers.docker.image import VmImage, ensure_image
from ddctl_agents.waiting import wait_until

if TYPE_CHECKING:
    from ddctl.config.regions import Region

log = logging.getLogger(__name__)
REGION_LABEL = "ddctl-region"
ROLE_LABEL = "ddctl-role"
HOST_KEY_LABEL = "ddctl-host-key"
SYNCER_HOST = 250
"""The syncer's address on every region network (.250; a sharded one's S1 .249, S2 .248, ...; learners are handed
.2-.127)."""
SYNCER_PORT = 8443
"""The syncer's port inside its VM (each VM has its own network stack)."""
SUBNET_POOL = ipaddress.IPv4Network("10.213.0.0/16")
POOL_OVERLAP = 403
"""The Engine API's status for a subnet that overlaps another network's (libnetwork's ForbiddenError)."""


def network_name(run: str, region: str) -> str:
    return f"ddctl-{run}-{region}"


def container_name(run: str, name: str) -> str:
    return f"ddctl-{run}-{name}"


class DockerProvider:
    kind = "docker"
    power_off = "kill 1"  # pid 1 is the container's sshd: the "VM" stops

    def __init__(self) -> None:
        self.engine = Engine()
        self._image: VmImage | None = None

    @property
    def image(self) -> VmImage:
        if self._image is None:
            self._image = ensure_image(self.engine)
        return self._image

    # -- regions ------------------------------------------------------------------------------
    def bootstrap(
        self, run: str, regions: list[Region], syncer_region: str = "", syncer_host: str = "", shard_regions: tuple[str, ...] = ()
    ) -> dict[str, RegionInfo]:
        """A network per region (kept if it exists) and the run's metadata endpoint; idempotent."""
        subnets = self.subnets(run)
        missing = [r.name for r in regions if r.name not in subnets]
        subnets.update(self._create_networks(run, missing))
        port = metadata.ensure_endpoint(run, RunDir(run).metadata_port, RunDir(run).log("metadata"))
        shaping = linkshape.available() is None
        return {
            r.name: RegionInfo(
                region=r.name,
                provider=self.kind,
                python=self.image.python,
                remote=True,
                syncer_host=syncer_host or str(subnets[r.name][SYNCER_HOST]),
                syncer_port=SYNCER_PORT,
                shard_addresses=not syncer_host,  # every shard's container joins every region network
                notice_url=f"http://{subnets[r.name][1]}:{port}{metadata.NOTICE_PATH}",
                shaped=(r.link.up_mbps, r.link.down_mbps) if r.link is not None and shaping else None,
            )
            for r in regions
        }

    def subnets(self, run: str) -> dict[str, ipaddress.IPv4Network]:
        """Each region network of ``run`` and its subnet (a network listed without them is logged and skipped)."""
        found = {}
        for n in self.engine.networks({RUN_LABEL: run}):
            region, configs = dug(n, "Labels", REGION_LABEL), dug(n, "IPAM", "Config")
            subnet = dug(configs[0], "Subnet") if isinstance(configs, list) and configs else None
            try:
                if not isinstance(region, str) or not isinstance(subnet, str):
                    raise ValueError(subnet)
                found[region] = ipaddress.IPv4Network(subnet)
            except ValueError:
                log.warning("the engine listed a network of run %s without its region or subnet: skipped (%.200r)", run, n)
        return found

    def _create_networks(self, run: str, regions: list[str]) -> dict[str, ipaddress.IPv4Network]:
        """One labelled bridge network per region, on a free /24 of 10.213.0.0/16."""
        taken = {ipaddress.IPv4Network(s) for s in self.engine.all_subnets() if ":" not in s}
        free = (net for net in SUBNET_POOL.subnets(new_prefix=24) if not any(net.overlaps(t) for t in taken))
        made: dict[str, ipaddress.IPv4Network] = {}
        for region in regions:
            for subnet in free:
                try:
                    self.engine.create_network(
                        network_name(run, region),
                        str(subnet),
                        str(subnet[1]),
                        {RUN_LABEL: run, REGION_LABEL: region},
                        ip_range=str(ipaddress.IPv4Network(f"{subnet[0]}/25")),
                    )
                except EngineError as exc:
                    if exc.status == POOL_OVERLAP:
                        continue  # someone took it since we looked
                    raise
                made[region] = subnet
                break
            else:
                raise ProvisionError(
                    f"no free /24 left in {SUBNET_POOL} for region {region}", kind="quota", scope="cloud", provider=self.kind
                )
        return made

    # -- instances ----------------------------------------------------------------------------
    def create(self, spec: InstanceSpec) -> Instance:
        """Boot the container with sshd and the pinned keys, shape its link; return once sshd answers."""
        subnets = self.subnets(spec.run)
        if spec.region not in subnets:
            raise DdctlError(f"run {spec.run} has no network for region {spec.region}; bootstrap it first")
        rundir = RunDir(spec.run)
        host_private, host_public = deploy.new_keypair()
        client_public = deploy.ensure_client_key(rundir.ssh_key)
        network = network_name(spec.run, spec.region)
        is_syncer = spec.role == "syncer"
        home = subnets[spec.region]
        fixed = (
            _syncer_address(home, spec.name)  # reachable at the same address after a restart
            if is_syncer
            else fresh_address(home, self._held(spec.run, network), rundir.docker_addresses)
        )
        endpoint = {"IPAMConfig": {"IPv4Address": fixed}}
        for local in spec.disks.values():
            Path(local).mkdir(parents=True, exist_ok=True)
        name = container_name(spec.run, spec.name)
        self.engine.remove(name)  # a leftover of an earlier life of this instance
        ident = self.engine.create_container(
            name,
            {
                "Image": self.image.ref,
                "Cmd": ["/usr/sbin/sshd", "-D", "-e"],
                "Hostname": spec.name.lower(),
                "Labels": {
                    RUN_LABEL: spec.run,
                    NAME_LABEL: spec.name,
                    REGION_LABEL: spec.region,
                    ROLE_LABEL: spec.role,
                    HOST_KEY_LABEL: host_public,
                },
                "HostConfig": {
                    "Binds": [
                        *self.image.binds,
                        *(f"{local}:{remote}" for remote, local in spec.disks.items()),
                        *(f"{path}:{path}:ro" for path in spec.mounts),  # the job's data on this machine
                    ],
                    "NetworkMode": network,
                },
                "NetworkingConfig": {"EndpointsConfig": {network: endpoint}},
            },
        )
        try:
            secrets = {
                "etc/ssh/ssh_host_ed25519_key": (host_private, 0o600),
                "root/.ssh/authorized_keys": (client_public.encode() + b"\n", 0o600),
            }
            self.engine.put_archive(ident, tar_of(secrets))
            if is_syncer:  # reachable from every region, at the same address after a restart
                for region, subnet in subnets.items():
                    if region != spec.region:
                        self.engine.connect(network_name(spec.run, region), ident, _syncer_address(subnet, spec.name))
            self.engine.start(ident)
            info = self.engine.inspect(ident) or {}
            address = _address_on(info, network)
            if spec.link is not None and linkshape.available() is None:
                pid = dug(info, "State", "Pid")
                if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                    raise EngineError(f"the engine answered no process id for {spec.name}: {str(pid)[:40]!r}")
                linkshape.shape_netns_of(pid, *spec.link)
            with rundir.known_hosts.open("a") as pinned:
                pinned.write(deploy.known_hosts_line(deploy.Target(address, host_public, rundir.ssh_key)) + "\n")
            wait_until(lambda: _answers(address, 22), timeout_s=30, every_s=0.05, what=f"sshd of {spec.name}")
        except BaseException:
            self.engine.remove(ident)
            raise
        return Instance(name=spec.name, provider_id=ident, run=spec.run, alive=True, address=address, private_address=address)

    def _held(self, run: str, network: str) -> list[str]:
        """The addresses ``run``'s containers hold on ``network`` now."""
        containers = self.engine.containers({RUN_LABEL: run})
        held = (dug(c, "NetworkSettings", "Networks", network, "IPAddress") for c in containers)
        return [address for answered in held if (address := ipv4(answered))]

    def list_run(self, run: str) -> list[Instance]:
        found = []
        for c in self.engine.containers({RUN_LABEL: run}):
            labels = c.get("Labels")
            if not isinstance(labels, dict) or not isinstance(c.get("Id"), str):
                log.warning("the engine listed a container of run %s without its labels or id: skipped", run)
                continue
            home = network_name(run, str(labels.get(REGION_LABEL, "")))  # its region's, not the syncer's other ones
            address = ipv4(dug(c, "NetworkSettings", "Networks", home, "IPAddress")) or ""
            name, alive = str(labels.get(NAME_LABEL, "?")), c.get("State") == "running"
            found.append(Instance(name=name, provider_id=c["Id"], run=run, alive=alive, address=address, private_address=address))
        return sorted(found, key=lambda i: i.name)

    def ssh_target(self, instance: Instance) -> deploy.Target:
        """How to reach a running instance over SSH (its address and pinned host key come from Docker)."""
        info = self.engine.inspect(instance.provider_id)
        if info is None or dug(info, "State", "Running") is not True:
            raise DdctlError(f"{instance.name} is not running")
        region, host_key = (
            dug(info, "Config", "Labels", REGION_LABEL),
            deploy.pinnable(dug(info, "Config", "Labels", HOST_KEY_LABEL)),
        )
        if not isinstance(region, str) or host_key is None:
            raise EngineError(f"the engine answered {instance.name} without its region or a host key to pin")
        address = _address_on(info, network_name(instance.run, region))
        return deploy.Target(address, host_key, RunDir(instance.run).ssh_key)

    def _wait_stopped(self, instance: Instance, timeout_s: float) -> bool:
        def stopped() -> bool:
            info = self.engine.inspect(instance.provider_id)
            return dug(info, "State", "Running") is not True

        try:
            return wait_until(stopped, timeout_s=timeout_s, what=f"{instance.name} to stop")
        except TimeoutError:
            return False

    def terminate(self, instance: Instance, grace_s: float = 10.0) -> None:
        """SIGTERM the agent (it pushes and leaves, then powers off), wait, then remove the container."""
        if instance.alive:
            with contextlib.suppress(EngineError):  # it may have stopped between the listing and now
                self.engine.exec_detached(instance.provider_id, ["sh", "-c", f"kill -TERM $(cat {deploy.REMOTE_ROOT}/agent.pid)"])
            self._wait_stopped(instance, grace_s)
        self.retire(instance, RunDir(instance.run).log(instance.name))

    def preempt(self, instance: Instance, notice_s: float) -> None:
        """Post the notice to the metadata endpoint; kill the container when it runs out (if still up)."""
        port_file = RunDir(instance.run).metadata_port
        if not port_file.exists():
            raise DdctlError(f"run {instance.run} has no metadata endpoint ({port_file} is missing)")
        metadata.post_notice(int(port_file.read_text()), instance.provider_id, notice_s)
        if not self._wait_stopped(instance, notice_s):
            self.engine.kill(instance.provider_id)

    def notices(self, run: str) -> list[PreemptionNotice]:
        port_file = RunDir(run).metadata_port
        if not port_file.exists():
            return []
        names = {i.provider_id: i.name for i in self.list_run(run)}
        return [
            PreemptionNotice(instance=names[ident], seconds_left=left)
            for ident, left in metadata.seconds_left(int(port_file.read_text())).items()
            if ident in names
        ]

    def read_file(self, instance: Instance, path: str, limit: int | None = None) -> bytes | None:
        return self.engine.get_file(instance.provider_id, path, console.limit_of(path, limit)) if instance.provider_id else None

    def retire(self, instance: Instance, log: Path) -> None:
        """Append the agent's log to ``log`` on this machine, then remove the container; a log past
        ``deploy.LOG_LIMIT`` is named in its place (the container is removed all the same)."""
        where = f"{deploy.REMOTE_ROOT}/agent.log"
        try:
            text = self.engine.get_file(instance.provider_id, where, deploy.LOG_LIMIT)
        except deploy.TooLarge as exc:
            text = f"(the agent's log was not collected: {exc})\n".encode()
        if text:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as out:
                out.write(f"==> container {instance.provider_id[:12]} <==\n".encode() + text)
        self.engine.remove(instance.provider_id)

    def cleanup(self, run: str) -> list[tuple[str, str]]:
        """The run's metadata endpoint and networks (once its containers are gone)."""
        removed = [("metadata endpoint", name) for name in metadata.stop_endpoint(run)]
        for net in self.engine.networks({RUN_LABEL: run}):
            self.engine.remove_network(net["Id"])
            removed.append(("network", net["Name"]))
        return removed

    # -- chaos and errors ---------------------------------------------------------------------
    def sweep(self, regions: list[Region], live: set[str], now: float) -> list[tuple[str, str]]:
        """Nothing to sweep: this machine's runs are found by ``ddctl down --run`` and ``ddctl gc``."""
        return []

    def admit(self, run: str, learners: Mapping[str, str]) -> None:
        """Nothing to open: this machine's regions reach the syncer without firewall rules."""

    def cut_link(self, run: str, region: str) -> None:
        """Disconnect the syncer's containers (every shard's) from ``region``'s network: its learners lose the syncer."""
        syncers = self._syncers(run)
        if any(s["Labels"][REGION_LABEL] == region for s in syncers):
            raise DdctlError(f"{region} is the syncer's own region (a shard runs there); partition another one")
        for syncer in syncers:
            self.engine.disconnect(network_name(run, region), syncer["Id"])

    def heal_link(self, run: str, region: str) -> None:
        """Reconnect the syncer (every shard) to ``region`` at its usual address (.250, .249, ...): learners find it
        where it was."""
        subnet = self.subnets(run)[region]
        for syncer in self._syncers(run):
            self.engine.connect(network_name(run, region), syncer["Id"], _syncer_address(subnet, syncer["Labels"][NAME_LABEL]))

    def classify(self, error: Exception) -> ProvisionError:
        """The engine's refusals: 409/403 are this machine's limits (quota), the rest transient."""
        if isinstance(error, ProvisionError):
            return error
        status = error.status if isinstance(error, EngineError) else 0
        code = str(status or type(error).__name__)
        if status in (403, 409):
            return ProvisionError(str(error), kind="quota", scope="cloud", code=code, provider=self.kind)
        return ProvisionError(str(error), kind="transient", scope="cloud", code=code, provider=self.kind)

    def _syncers(self, run: str) -> list[dict[str, Any]]:
        running = [c for c in self.engine.containers({RUN_LABEL: run, ROLE_LABEL: "syncer"}) if c.get("State") == "running"]
        if not running:
            raise DdctlError(f"run {run} has no running syncer container")
        return running


def _syncer_address(subnet: ipaddress.IPv4Network, name: str) -> str:
    """A synchronizer container's fixed address on a region network: .250 for the syncer (shard S0), .249 for S1, ..."""
    return str(subnet[SYNCER_HOST - syncer_index(name)])


def _answers(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


__all__ = ["SYNCER_PORT", "DockerProvider", "container_name", "network_name"]


def _address_on(info: dict[str, Any], network: str) -> str:
    """A container's address on ``network`` as the engine inspects it, checked: it becomes a pinned ``known_hosts``
    line, an SSH host and a rendezvous (an answer with a newline would add a pin of its own)."""
    answered = dug(info, "NetworkSettings", "Networks", network, "IPAddress")
    address = ipv4(answered)
    if address is None:
        raise EngineError(f"the engine answered no IPv4 address for the container on {network}: {str(answered)[:60]!r}")
    return address

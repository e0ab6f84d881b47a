"""The provider contract: the lifecycle verbs every region kind implements, and the records they trade.

In SkyPilot's spirit, a provider is a short list of verbs behind one registry
(``ddctl.providers.get``), with typed records at the boundary and its SDK
imported lazily:

- ``bootstrap(run, regions, syncer_region, ...)``: what a region needs before instances (networks,
  security groups, key material, a metadata endpoint), idempotent; answers a
  ``RegionInfo`` per region: the interpreter on its machines, where its learners
  reach the syncer, its notice URL, how files reach its machines.
- ``create(spec)``: provision one instance and return once it can be reached.
  A machine with an SSH target gets its agent from the shared deploy
  (``control/launch.py``); a provider without one (local processes) runs the
  spec's command itself.
- ``list_run(run)``, ``terminate(instance)``, ``ssh_target(instance)``,
  ``preempt(instance, notice_s)`` (chaos), ``notices(run)``, ``read_file``,
  ``retire`` (collect the log, remove), ``cleanup(run)`` (what is left besides
  instances), ``admit(run, learners)`` (the syncer's port open to exactly the
  run's learners, in whatever cloud they run), ``cut_link`` / ``heal_link``
  (chaos partitions, where the provider can), and ``classify(error) -> ProvisionError`` so that failover can
  decide without reading messages.

Labels (tags) are the truth: every instance carries the run and its name, so a
run is found and removed with the local state gone.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ddctl.errors import DdctlError, ProvisionError

if TYPE_CHECKING:
    from ddctl.config.regions import Region
    from ddctl.providers.deploy import Target

RUN_LABEL = "ddctl-run"
NAME_LABEL = "ddctl-name"
LOOPBACK = "127.0.0.1"
"""Where a local process reaches the run's others on this machine (the nodes of a learner meet at node 0's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RegionInfo:
    """What ``bootstrap`` made of one region, and what every instance there must be told."""

    region: str
    provider: str
    python: str
    """The interpreter on the region's machines."""
    remote: bool
    """Machines of their own: the agent's files are copied in and paths are theirs (``deploy.REMOTE_ROOT``)."""
    syncer_host: str
    """The address this region's learners reach the syncer at (it also goes in the syncer's certificate)."""
    syncer_bind: str = "0.0.0.0"
    """Where the syncer listens when it runs in this region."""
    syncer_port: int = 0
    """The syncer's port when it runs in this region (0: a free port of this machine is chosen)."""
    notice_url: str | None = None
    """Learners poll it for spot notices; None: a notice arrives as SIGTERM."""
    command_prefix: tuple[str, ...] = ()
    """Prepended to a local instance's command (the shaped network namespace it runs in)."""
    shaped: tuple[float, float] | None = None
    """(up, down) Mbit/s the region's links are shaped to, where they are."""
    machine: dict[str, Any] = field(default_factory=dict)
    """How the provider makes this region's VMs (instance types, image, ...): copied into each instance's spec."""
    shard_addresses: bool = False
    """Each shard of a sharded synchronizer has an address of its own: ``shard_host`` (Docker: .250, .249, ...);
    False: every shard is at ``syncer_host``, each on its own port (local processes)."""
    shard_hosts: tuple[str, ...] = ()
    """Where each shard is reached, by index, when shards run on cloud VMs: each has a reserved public address of
    its own (a provider fills in its own shards', "" for another provider's; ``up`` joins them into every region's)."""

    def shard_host(self, index: int) -> str:
        """Where this region's learners reach shard ``index`` (0: the syncer's own address)."""
        if self.shard_hosts:
            return self.shard_hosts[index]
        return str(ipaddress.IPv4Address(self.syncer_host) - index) if self.shard_addresses else self.syncer_host


def joined_shard_hosts(infos: Mapping[str, RegionInfo], shard_regions: tuple[str, ...]) -> dict[str, RegionInfo]:
    """Every region told every cloud shard's address: shard i's as its own region's provider reserved it (each
    provider knows its own shards' only). Shards on this machine keep their provider's rule (``shard_host``)."""
    if not shard_regions or not infos[shard_regions[0]].shard_hosts:
        return dict(infos)
    hosts = tuple(infos[region].shard_hosts[i] for i, region in enumerate(shard_regions))
    return {name: replace(info, shard_hosts=hosts) for name, info in infos.items()}


def syncer_name(index: int) -> str:
    """The instance name of a synchronizer process: ``syncer`` (alone, or shard S0), ``syncer-s1`` for S1, ..."""
    return "syncer" if index == 0 else f"syncer-s{index}"


def syncer_index(name: str) -> int:
    """The shard index of a synchronizer instance's name (``syncer_name``'s inverse); 0 for anything else."""
    number = name.removeprefix("syncer-s")
    return int(number) if name.startswith("syncer-s") and number.isdigit() else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceSpec:
    """One instance to create: a syncer, a learner, or a helper process of ``region``."""

    run: str
    name: str
    region: str
    role: str  # syncer | learner | controller | metadata
    argv: tuple[str, ...]
    """The agent command the instance runs (python -m ...), with paths as the instance sees them."""
    log: Path
    """Where this machine keeps the instance's log (collected from remote instances)."""
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    """Remote path -> local path of files copied into a remote instance (tokens, TLS, job)."""
    disks: dict[str, str] = field(default_factory=dict)
    """Remote path -> local directory that outlives the instance (the syncer's state)."""
    link: tuple[float, float] | None = None
    """(up, down) Mbit/s this instance's link is shaped to, where the provider shapes links."""
    summary: str = ""
    """Where the agent writes its exit summary, as the instance sees it."""
    zone: str = ""
    """Where to place it: a zone of ``cloud_region`` (empty: the provider's choice); set by failover."""
    cloud_region: str = ""
    """The cloud region to place it in (empty: the region's own); set by failover."""
    machine: dict[str, Any] = field(default_factory=dict)
    """The provider's own settings for the VM (from its region's ``RegionInfo.machine``); opaque to the control plane."""
    mounts: tuple[str, ...] = ()
    """Directories of this machine the instance reads at the same paths (the job's local data), read-only: a local
    process has them, a Docker VM gets them bound; a cloud VM cannot (``up`` refuses local data for cloud regions)."""

    @property
    def label(self) -> str:
        return f"{RUN_LABEL}={self.run}"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["log"], out["argv"] = str(self.log), list(self.argv)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> InstanceSpec:
        link = raw.get("link")
        return cls(
            **{
                **raw,
                "argv": tuple(raw["argv"]),
                "mounts": tuple(raw.get("mounts", ())),
                "log": Path(raw["log"]),
                "link": None if link is None else (float(link[0]), float(link[1])),
            }
        )


def dug(answer: object, *path: str) -> object:
    """``answer[path[0]][path[1]]...`` where each level is a JSON object, else None: a field deep in an API's
    answer, read without a KeyError or an AttributeError when a level has another shape."""
    for key in path:
        if not isinstance(answer, dict):
            return None
        answer = answer.get(key)
    return answer


def answered_ipv4(value: object, what: str) -> str:
    """``value`` as ``ipv4`` reads it, or a DdctlError saying which answer was not an address (an address with an
    ``@`` or a newline became another host in every learner's URL and a name in the run's certificate)."""
    address = ipv4(value)
    if address is None:
        raise DdctlError(f"{what} is not an IPv4 address: {str(value)[:60]!r}")
    return address


def ipv4(value: object) -> str | None:
    """``value`` if it is a dotted IPv4 address, else None: an address a cloud API answers is checked in type and
    shape before it becomes an SSH host, a firewall rule or a rendezvous."""
    if not isinstance(value, str):
        return None
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    name: str
    provider_id: str
    run: str
    alive: bool
    address: str = ""
    """Where it is reached (a container's or VM's address; empty for a local process)."""
    zone: str = ""
    private_address: str = ""
    """Where the run's other machines in its region reach it (a VM's private IP, a container's IP on its region's
    network, 127.0.0.1 for a local process): the nodes of one learner meet at its first node's (torchrun's c10d)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionNotice:
    instance: str
    seconds_left: float


class Provider(Protocol):
    kind: str
    power_off: str
    """The command a machine runs when its agent ends, so that "alive" means "the agent runs"."""

    def bootstrap(
        self, run: str, regions: list[Region], syncer_region: str = "", syncer_host: str = "", shard_regions: tuple[str, ...] = ()
    ) -> dict[str, RegionInfo]:
        """Make what the regions need before instances (idempotent); what each region's instances must know.

        ``syncer_region``: the region (by name) the syncer runs in; every region's learners must reach it.
        ``syncer_host``: where the syncer is reached when it runs in another provider's region (that
        provider's bootstrap, run first, said); empty when the syncer's region is one of ``regions``.
        ``shard_regions``: the region of each shard of a sharded synchronizer, by index (empty: one syncer); a cloud
        reserves an address for each shard in its regions (``RegionInfo.shard_hosts``)."""
        ...

    def create(self, spec: InstanceSpec) -> Instance:
        """Provision one instance; return once it can be reached (over SSH, or running for a local process)."""
        ...

    def list_run(self, run: str) -> list[Instance]:
        """Every instance labelled with ``run``; ``alive`` is False once its agent has ended."""
        ...

    def terminate(self, instance: Instance, grace_s: float = 10.0) -> None:
        """Ask the agent to leave (SIGTERM), wait up to ``grace_s``, then remove the instance."""
        ...

    def ssh_target(self, instance: Instance) -> Target | None:
        """How to reach a running machine over SSH (pinned host key); None where there is no machine."""
        ...

    def preempt(self, instance: Instance, notice_s: float) -> None:
        """A spot interruption: the notice now, the kill ``notice_s`` later (sooner if the agent has left)."""
        ...

    def notices(self, run: str) -> list[PreemptionNotice]: ...

    def read_file(self, instance: Instance, path: str, limit: int | None = None) -> bytes | None:
        """A file of the instance (alive or not); None if it is not there; ``deploy.TooLarge`` past ``limit`` bytes
        (None: ``console.limit_of(path)``), read no further than that: the machine's answer is not trusted."""
        ...

    def retire(self, instance: Instance, log: Path) -> None:
        """Collect the log of an instance whose agent ended into ``log``, then remove what is left of it."""
        ...

    def cleanup(self, run: str) -> list[tuple[str, str]]:
        """Remove what the run left besides instances; returns (kind, name) of each: ("network", "ddctl-x-eu")."""
        ...

    def sweep(self, regions: list[Region], live: set[str], now: float) -> list[tuple[str, str]]:
        """Remove what runs not in ``live`` (or past their expiry) left in these regions; (kind, name) of each.

        Clouds only: local providers' runs live on this machine and ``ddctl down --run`` finds them."""
        ...

    def admit(self, run: str, learners: Mapping[str, str]) -> None:
        """Where this provider runs the run's syncer: open its port to exactly these learners (name -> public
        address, in any cloud) besides the operator, and close it to the rest; elsewhere nothing to do."""
        ...

    def cut_link(self, run: str, region: str) -> None:
        """Cut ``region`` off from the syncer (a chaos partition); DdctlError where the provider cannot."""
        ...

    def heal_link(self, run: str, region: str) -> None: ...

    def classify(self, error: Exception) -> ProvisionError:
        """``error`` (the SDK's, the engine's) as a ProvisionError whose kind and scope failover acts on."""
        ...


def own_or_attached_gpus(
    table: Mapping[str, tuple[str, int]], instance_type: str, accelerator: str = "", count: int = 1
) -> tuple[str, int] | None:
    """The GPUs a VM runs, (model, count): its type's own from a provider's table, else the ``count`` x
    ``accelerator`` the regions file attaches; None without GPUs. One rule for every provider's ``gpus``."""
    if instance_type in table:
        return table[instance_type]
    return (accelerator, count) if accelerator else None

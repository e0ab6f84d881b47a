"""Where a run's relays are: each relayed region's port, and its host learner's address (``agent/relay_host.py``).

A region's relay runs on the machine of its first learner (the plan's ``relay="host"``), so its address is known only
once that machine is up: ``up`` starts the hosts before the other learners and points those at it, and the controller
points a replacement at the host's address as it is now. Where the host does not run, a learner is given the relay's
port and no host: its versions come from the shards, which it asks where the relay is until the host is back and
its relay tells them (``agent/subscription.py``).
"""

from __future__ import annotations

from ddctl.control.plan import PlannedInstance
from ddctl.control.specs import relay_port, with_relay
from ddctl.control.state import InstanceRecord, State
from ddctl.providers.base import Instance, InstanceSpec, Provider, RegionInfo


def ports(run: str, state: State, planned: list[PlannedInstance], infos: dict[str, RegionInfo]) -> dict[str, int]:
    """Each relayed region's relay port: the one the run recorded (a converging ``up`` keeps it), else a new one."""
    detail = state.run(run).detail  # type: ignore[union-attr]  # the run is recorded by now
    known = {str(k): int(v) for k, v in detail.get("relay_ports", {}).items()}
    wanted = {i.region: known.get(i.region) or relay_port(infos[i.region]) for i in planned if i.relay == "host"}
    if wanted != known:
        state.update_run_detail(run, {"relay_ports": wanted})
    return wanted


def point_at(
    run: str,
    owners: dict[str, Provider],
    planned: list[PlannedInstance],
    specs: dict[str, InstanceSpec],
    addresses: dict[str, str],
    names: list[str],
) -> None:
    """``names``' specs pointed at their region's relay (``with_relay``): its host's address, from ``addresses`` (hosts
    started in this pass) or from its provider (one that already runs); none where the host does not run."""
    hosts = {i.region: i for i in planned if i.relay == "host"}
    for name in names:
        host = hosts.get(specs[name].region)
        if host is None or "--relay" not in specs[name].argv:
            continue
        if host.name not in addresses:
            running = [i for i in owners[host.provider].list_run(run) if i.name == host.name and i.alive]
            addresses[host.name] = running[0].private_address if running else ""
        specs[name] = with_relay(specs[name], addresses[host.name])


def host_addresses(records: dict[str, InstanceRecord], listed: dict[str, Instance]) -> dict[str, str]:
    """Each relayed region's host learner's address now (the controller's view), where that machine is alive."""
    return {
        r.region: listed[r.name].private_address
        for r in records.values()
        if r.detail.get("relay") == "host" and r.name in listed and listed[r.name].alive
    }

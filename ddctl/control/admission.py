"""The syncer's port, open to exactly the run's live learners, in whatever cloud each one runs.

A learner in one cloud reaching a syncer in another comes from a public address
only its own provider knows. The control plane joins the two: after a learner
is created (before its agent starts) and whenever the controller sees the set
change (a replacement came up at a new address, an old one went), the syncer's
provider (each provider running a shard of it) is told the exact set
(``Provider.admit``) and makes its firewall say so. A region cut off by
``ddctl chaos partition`` is left out until it heals, so a partition holds on
any cloud. ``wanted`` is the pure part.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from ddctl import providers
from ddctl.control.rundir import RunDir
from ddctl.providers.base import Instance, Provider

if TYPE_CHECKING:
    from ddctl.control.state import InstanceRecord

_lock = threading.Lock()
"""One admission at a time per process: two threads rewriting one firewall would drop each other's learner."""


def wanted(listed: Mapping[str, Instance], regions: Mapping[str, str], partitioned: set[str]) -> dict[str, str]:
    """Learner name -> address for every live learner with an address outside a partitioned region (pure)."""
    return {
        name: instance.address
        for name, instance in sorted(listed.items())
        if name in regions and instance.alive and instance.address and regions[name] not in partitioned
    }


def partitioned(run: str) -> set[str]:
    """The regions ``ddctl chaos partition`` has cut off right now."""
    path = RunDir(run).root / "partitioned"
    return set(path.read_text().split()) if path.exists() else set()


def set_partitioned(run: str, region: str, cut: bool) -> None:
    path = RunDir(run).root / "partitioned"
    regions = (partitioned(run) | {region}) if cut else (partitioned(run) - {region})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{r}\n" for r in sorted(regions)))


def list_learners(run: str, owners: Mapping[str, Provider], regions: Mapping[str, str]) -> dict[str, Instance]:
    """The run's learners as each of their providers lists them (``regions``: learner name -> region)."""
    return {i.name: i for provider in owners.values() for i in provider.list_run(run) if i.name in regions}


def admit(run: str, syncers: Iterable[Provider], owners: Mapping[str, Provider], regions: Mapping[str, str]) -> dict[str, str]:
    """List the learners everywhere, and open the port of the syncer (of every shard: on each provider that runs one)
    to exactly the live ones; returns the set."""
    with _lock:
        chosen = wanted(list_learners(run, owners, regions), regions, partitioned(run))
        for syncer in syncers:
            syncer.admit(run, chosen)
    return chosen


def admit_run(run: str, records: Iterable[InstanceRecord], provider_of: Callable[[str], Provider]) -> dict[str, str] | None:
    """``admit`` for a run as the state records it; None where its syncer runs on this machine (no port to open)."""
    records = list(records)
    clouds = sorted({r.provider for r in records if r.role == "syncer" and not providers.KINDS[r.provider].local})
    if not clouds:
        return None
    owners = {r.provider: provider_of(r.provider) for r in records}
    return admit(run, [owners[kind] for kind in clouds], owners, {r.name: r.region for r in records if r.role == "learner"})

"""``ddctl chaos``: failures on purpose, to see the job ride through them.

``preempt``: a spot interruption with its notice. The notice reaches the
learner the way a cloud's does: a Docker VM's agent reads it from the
instance-metadata endpoint, a local process gets SIGTERM. Either way it pushes
its pending outer gradients and leaves; when the notice runs out the instance
is killed. The controller then replaces it.

``partition``: a network fault, not a crash. A Docker region's network is
disconnected from the syncer for a while and then restored (in a cloud, the
syncer's firewall leaves the region's learners out: ``control/admission.py``); its learners keep
training, keep their drift and reconnect on their own, while the other regions
keep merging. The link is restored even if the command is interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ddctl import providers
from ddctl.control import admission
from ddctl.control.state import State
from ddctl.errors import DdctlError

MAX_PARTITION_S = 3600.0
MAX_NOTICE_S = 3600.0
"""A preemption notice: clouds give 30 s (GCP) to 120 s (AWS); an hour is past any."""


def preempt(run: str, state: State, region: str, notice_s: float = 30.0) -> dict[str, Any]:
    if not 0 <= notice_s <= MAX_NOTICE_S:  # NaN fails too
        raise DdctlError(f"--notice must be in [0, {MAX_NOTICE_S:g}] seconds, got {notice_s}")
    learners = {i.name: i for i in state.instances(run) if i.role == "learner" and i.region == region}
    if not learners:
        regions = sorted({i.region for i in state.instances(run) if i.role == "learner"})
        raise DdctlError(f"run {run} has no learners in region {region!r}; regions with learners: {', '.join(regions)}")
    kind = next(iter(learners.values())).provider
    provider = providers.get(kind)
    alive = [i for i in provider.list_run(run) if i.name in learners and i.alive]
    if not alive:
        raise DdctlError(f"no learner of {region!r} is running right now (replacement may be starting)")
    victim = alive[0]
    state.event(run, "preemption-notice", instance=victim.name, region=region, notice_s=notice_s)
    started = time.time()
    provider.preempt(victim, notice_s)
    record = learners[victim.name]
    state.put_instance(replace(record, state="preempted", provider_id=victim.provider_id, updated=time.time()))
    state.event(run, "preempted", instance=victim.name, region=region)
    return {
        "run": run,
        "region": region,
        "instance": victim.name,
        "provider": kind,
        "notice_s": notice_s,
        "seconds_to_exit": round(time.time() - started, 2),
    }


def partition(run: str, state: State, region: str, seconds: float, on_cut: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Cut ``region`` off from the syncer for ``seconds``, then restore it (always, even on Ctrl-C)."""
    if not 0 < seconds <= MAX_PARTITION_S:
        raise DdctlError(f"--for must be in (0, {MAX_PARTITION_S:.0f}] seconds, got {seconds}")
    records = [i for i in state.instances(run) if i.role == "learner"]
    here = [i for i in records if i.region == region]
    if not here:
        regions = sorted({i.region for i in records})
        raise DdctlError(f"run {run} has no learners in region {region!r}; regions with learners: {', '.join(regions)}")
    provider = providers.get(here[0].provider)
    admission.set_partitioned(run, region, True)  # the syncer's port leaves the region out, on any cloud
    try:
        provider.cut_link(run, region)
        admission.admit_run(run, state.instances(run), providers.get)
    except BaseException:
        admission.set_partitioned(run, region, False)
        raise
    cut_at = time.time()
    state.event(run, "partition", region=region, seconds=seconds)
    on_cut()
    try:
        time.sleep(seconds)
    finally:
        admission.set_partitioned(run, region, False)
        provider.heal_link(run, region)
        admission.admit_run(run, state.instances(run), providers.get)
        healed_at = time.time()
        state.event(run, "partition-healed", region=region, seconds=round(healed_at - cut_at, 2))
    return {"run": run, "region": region, "seconds": round(healed_at - cut_at, 2), "cut_at": cut_at, "healed_at": healed_at}

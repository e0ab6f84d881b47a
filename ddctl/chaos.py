"""``ddctl chaos preempt``: a spot interruption, on purpose, with its notice.

The notice reaches the learner the way a cloud's does: a Docker VM's agent
reads it from the instance-metadata endpoint, a local process gets SIGTERM.
Either way it pushes its pending outer gradients and leaves; when the notice
runs out the instance is killed. The controller then replaces it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ddctl import providers
from ddctl.errors import DdctlError
from ddctl.state import State


def preempt(run: str, state: State, region: str, notice_s: float = 30.0) -> dict[str, Any]:
    if notice_s < 0:
        raise DdctlError(f"--notice must be >= 0 seconds, got {notice_s}")
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

"""``ddctl logs`` and ``ssh``: looking into a running job's machines from the laptop, on any provider."""

from __future__ import annotations

from pathlib import Path

from ddctl import providers
from ddctl.control.rundir import RunDir
from ddctl.control.state import InstanceRecord, State
from ddctl.errors import DdctlError
from ddctl.providers import deploy
from ddctl.providers.base import Instance


def _region_instances(run: str, state: State, region: str) -> list[InstanceRecord]:
    chosen = [i for i in state.instances(run) if i.region == region and i.role in ("learner", "syncer")]
    if not chosen:
        regions = sorted({i.region for i in state.instances(run) if i.role in ("learner", "syncer")})
        raise DdctlError(f"run {run} has no region {region!r}; regions: {', '.join(regions)}")
    return chosen


def _running(run: str, records: list[InstanceRecord]) -> dict[str, tuple[str, Instance]]:
    """The records' running instances by name, with their provider kind (one listing per provider)."""
    out: dict[str, tuple[str, Instance]] = {}
    for kind in sorted({r.provider for r in records}):
        out.update({i.name: (kind, i) for i in providers.get(kind).list_run(run) if i.alive})
    return out


def logs(run: str, state: State, region: str) -> dict[str, str]:
    """Each instance's log: what this machine collected, and for a running machine its current log over SSH."""
    records = _region_instances(run, state, region)
    running = _running(run, records)
    out = {}
    for record in records:
        log = Path(record.detail["log"])
        text = log.read_text(errors="replace") if log.exists() else ""
        if record.name in running:
            kind, instance = running[record.name]
            target = providers.get(kind).ssh_target(instance)
            if target is not None:
                text += deploy.read_text(target, f"{deploy.REMOTE_ROOT}/agent.log")
        out[record.name] = text
    return out


def ssh_target(run: str, state: State, region: str, instance: str = "") -> tuple[deploy.Target, Path]:
    """The SSH target of a running instance of ``region`` (the first learner unless ``instance`` names one)."""
    records = _region_instances(run, state, region)
    if instance:
        records = [r for r in records if r.name == instance]
        if not records:
            raise DdctlError(f"region {region} of {run} has no instance {instance!r}")
    records.sort(key=lambda r: r.role != "learner")
    running = _running(run, records)
    for record in records:
        if record.name in running:
            kind, found = running[record.name]
            target = providers.get(kind).ssh_target(found)
            if target is None:
                raise DdctlError(
                    f"region {region} runs as local processes (provider {kind}); there is no machine to ssh into. "
                    f"Its logs: ddctl logs {region}"
                )
            return target, RunDir(run).known_hosts
    raise DdctlError(f"no instance of {region} is running right now (a replacement may be starting)")

"""``ddctl logs`` and ``ssh``: looking into a running job's machines from the laptop."""

from __future__ import annotations

from pathlib import Path

from ddctl import deploy, providers
from ddctl.errors import DdctlError
from ddctl.providers.base import Instance
from ddctl.providers.docker import known_hosts
from ddctl.state import InstanceRecord, State


def _region_instances(run: str, state: State, region: str) -> list[InstanceRecord]:
    chosen = [i for i in state.instances(run) if i.region == region and i.role in ("learner", "syncer")]
    if not chosen:
        regions = sorted({i.region for i in state.instances(run) if i.role in ("learner", "syncer")})
        raise DdctlError(f"run {run} has no region {region!r}; regions: {', '.join(regions)}")
    return chosen


def _live(run: str, record: InstanceRecord) -> Instance | None:
    for instance in providers.get(record.provider).list_run(run):
        if instance.name == record.name and instance.alive:
            return instance
    return None


def logs(run: str, state: State, region: str) -> dict[str, str]:
    """Each instance's log: what this machine collected, and for a running VM its current log over SSH."""
    out = {}
    for record in _region_instances(run, state, region):
        log = Path(record.detail["log"])
        text = log.read_text(errors="replace") if log.exists() else ""
        if record.provider == "docker" and (live := _live(run, record)) is not None:
            target = providers.get("docker").target(live)  # type: ignore[attr-defined]
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
    if records[0].provider != "docker":
        raise DdctlError(
            f"region {region} runs as local processes (provider {records[0].provider}); there is no machine to "
            f"ssh into. Its logs: ddctl logs {region}"
        )
    for record in records:
        if (live := _live(run, record)) is not None:
            return providers.get("docker").target(live), known_hosts(run)  # type: ignore[attr-defined]
    raise DdctlError(f"no instance of {region} is running right now (a replacement may be starting)")

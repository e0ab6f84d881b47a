"""``ddctl logs`` and ``ssh``: looking into a running job's machines from the laptop."""

from __future__ import annotations

from pathlib import Path

from ddctl.control.state import InstanceRecord, State
from ddctl.errors import DdctlError
from ddctl.providers import deploy
from ddctl.providers.base import Instance
from ddctl.providers.docker.vms import DockerProvider, known_hosts


def _region_instances(run: str, state: State, region: str) -> list[InstanceRecord]:
    chosen = [i for i in state.instances(run) if i.region == region and i.role in ("learner", "syncer")]
    if not chosen:
        regions = sorted({i.region for i in state.instances(run) if i.role in ("learner", "syncer")})
        raise DdctlError(f"run {run} has no region {region!r}; regions: {', '.join(regions)}")
    return chosen


def _running_vms(run: str) -> tuple[DockerProvider, dict[str, Instance]]:
    """The Docker provider and the run's running VMs by name (one listing for every instance asked about)."""
    docker = DockerProvider()
    return docker, {i.name: i for i in docker.list_run(run) if i.alive}


def logs(run: str, state: State, region: str) -> dict[str, str]:
    """Each instance's log: what this machine collected, and for a running VM its current log over SSH."""
    records = _region_instances(run, state, region)
    docker, running = _running_vms(run) if any(r.provider == "docker" for r in records) else (None, {})
    out = {}
    for record in records:
        log = Path(record.detail["log"])
        text = log.read_text(errors="replace") if log.exists() else ""
        if docker is not None and record.provider == "docker" and record.name in running:
            text += deploy.read_text(docker.target(running[record.name]), f"{deploy.REMOTE_ROOT}/agent.log")
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
    docker, running = _running_vms(run)
    for record in records:
        if record.name in running:
            return docker.target(running[record.name]), known_hosts(run)
    raise DdctlError(f"no instance of {region} is running right now (a replacement may be starting)")

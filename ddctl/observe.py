"""``ddctl status``, ``logs`` and ``ssh``: looking at a running job from the laptop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddctl import deploy, providers
from ddctl.errors import DdctlError, UnreachableError
from ddctl.providers.base import Instance
from ddctl.providers.docker import known_hosts
from ddctl.state import InstanceRecord, State, run_dir
from ddctl.up import admin_client
from ddctl_agents.agent.client import Unavailable


def status(run: str, state: State) -> dict[str, Any]:
    """The run as the issue's JSON: run, rounds, and regions with their learners."""
    record = state.run(run)
    if record is None:
        raise DdctlError(f"no run {run!r} in {state.path}")
    client = admin_client(run_dir(run))
    try:
        live = client.status()
    except Unavailable as exc:
        raise UnreachableError(f"the syncer of {run} is unreachable: {exc}") from None
    finally:
        client.close()
    by_name = {entry["id"]: entry for entry in live["learners"]}
    regions: dict[str, dict[str, Any]] = {}
    for inst in state.instances(run):
        if inst.role not in ("learner", "syncer"):
            continue
        region = regions.setdefault(inst.region, {"name": inst.region, "provider": inst.provider, "learners": []})
        if inst.role != "learner":
            continue
        seen = by_name.get(inst.name, {})
        region["learners"].append(
            {
                "id": inst.name,
                "state": seen.get("state", inst.state),
                "step": seen.get("step", 0),
                "tokens_per_s": seen.get("tokens_per_s", 0.0),
                "up_mbps": seen.get("up_mbps"),
                "down_mbps": seen.get("down_mbps"),
            }
        )
    return {
        "run": run,
        "rounds": live["rounds"],
        "regions": list(regions.values()),
        "ledger": live["ledger"],
        "val_bpb": live["val_bpb"],
    }


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

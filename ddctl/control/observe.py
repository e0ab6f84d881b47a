"""``ddctl logs`` and ``ssh``: looking into a running job's machines from the laptop, on any provider.

A name picks instances: an instance's own name (``L1``, ``syncer``, ``controller``) or a region's (for logs,
the region's learners and syncer; for ssh, its first running learner). A log comes from two places: the file
this machine keeps (a local process writes it; a retired VM's log is collected into it) and, while a machine
runs, its ``agent.log`` over SSH. Following reads both as they grow: local files by polling, each running VM
with ``tail -F`` over one SSH session (a replacement VM is found and followed from its first line). It only
reads: stopping it never touches the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddctl import providers
from ddctl.control.loglines import SinceFilter
from ddctl.control.rundir import RunDir
from ddctl.control.state import InstanceRecord, State
from ddctl.errors import DdctlError
from ddctl.providers import deploy
from ddctl.providers.base import Instance

AGENT_ROLES = ("learner", "syncer")
"""What a region's name picks: its agents, not the control-plane helpers that run beside the job."""
POLL_S = 0.5
"""How often ``--follow`` looks for new lines in local files."""
DISCOVER_S = 2.0
"""How often ``--follow`` looks for machines to follow (a replacement VM comes up under a new id)."""
Emit = Callable[[str, str], None]
"""``emit(instance name, line)``: where ``follow`` puts each line."""


def choose(run: str, state: State, name: str) -> list[InstanceRecord]:
    """The instances ``name`` stands for: the one so named, else a region's agents; else a usage error naming the valid ones."""
    records = state.instances(run)
    named = [r for r in records if r.name == name]
    if named:
        return named
    in_region = [r for r in records if r.region == name and r.role in AGENT_ROLES]
    if in_region:
        return in_region
    raise DdctlError(f"run {run} has no region or instance {name!r}; {choices(records)}")


def choices(records: list[InstanceRecord]) -> str:
    """``regions: a, b; instances: syncer, L0, ...``: what a user may name."""
    regions = ", ".join(sorted({r.region for r in records if r.region})) or "none"
    return f"regions: {regions}; instances: {', '.join(r.name for r in _ordered(records)) or 'none'}"


def listing(run: str, state: State) -> list[dict[str, str]]:
    """Every instance of the run, by region (the syncer first, helpers last), with its role and recorded state."""
    return [{"region": r.region, "instance": r.name, "role": r.role, "state": r.state} for r in _ordered(state.instances(run))]


def _ordered(records: list[InstanceRecord]) -> list[InstanceRecord]:
    return sorted(records, key=lambda r: (not r.region, r.region, r.role != "syncer", len(r.name), r.name))


def _running(run: str, records: list[InstanceRecord]) -> dict[str, tuple[str, Instance]]:
    """The records' running instances by name, with their provider kind (one listing per provider)."""
    names = {r.name for r in records}
    out: dict[str, tuple[str, Instance]] = {}
    for kind in sorted({r.provider for r in records}):
        out.update({i.name: (kind, i) for i in providers.get(kind).list_run(run) if i.alive and i.name in names})
    return out


def _targets(run: str, records: list[InstanceRecord]) -> dict[str, tuple[str, deploy.Target]]:
    """The records' running machines that SSH reaches: {name: (provider id, target)}; local processes have none."""
    out = {}
    for name, (kind, instance) in _running(run, records).items():
        target = providers.get(kind).ssh_target(instance)
        if target is not None:
            out[name] = (instance.provider_id, target)
    return out


def _local_text(record: InstanceRecord) -> str:
    log = Path(record.detail.get("log") or "/nonexistent")
    return log.read_text(errors="replace") if log.exists() else ""


def logs(run: str, state: State, name: str, since: float | None = None) -> dict[str, list[str]]:
    """Each chosen instance's log lines (at or after ``since``): collected here, then a running machine's over SSH."""
    records = choose(run, state, name)
    targets = _targets(run, records)
    out = {}
    for record in records:
        lines = _local_text(record).splitlines()
        if record.name in targets:
            lines += deploy.read_text(targets[record.name][1], deploy.AGENT_LOG).splitlines()
        keep = SinceFilter(since)
        out[record.name] = [line for line in lines if keep(line)]
    return out


@dataclass(slots=True)
class _LocalLog:
    """A local log file read as it grows; a line is handed out once it is complete."""

    path: Path
    keep: SinceFilter
    offset: int = 0
    partial: bytes = b""

    def read_new(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:  # replaced or truncated: read it again from the start
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        with self.path.open("rb") as file:
            file.seek(self.offset)
            data = file.read(size - self.offset)
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [text for text in (line.decode(errors="replace") for line in lines) if self.keep(text)]


def follow(
    run: str, state: State, name: str, emit: Emit, since: float | None = None, until: Callable[[], bool] = lambda: False
) -> None:
    """Emit the chosen instances' logs, then every new line as it comes, until interrupted (or ``until()``)."""
    records = choose(run, state, name)
    asyncio.run(_follow(run, records, emit, since, until))


async def _follow(run: str, records: list[InstanceRecord], emit: Emit, since: float | None, until: Callable[[], bool]) -> None:
    files = {r.name: _LocalLog(Path(r.detail.get("log") or "/nonexistent"), SinceFilter(since)) for r in records}
    over_ssh: set[str] = set()
    """Names whose machine is followed over SSH: their local file then only gets a copy of what was shown."""
    streams: dict[str, asyncio.Task[None]] = {}  # by provider id: each machine is followed once
    loop = asyncio.get_running_loop()
    discover_at, first = 0.0, True
    try:
        while not until():
            for name, local in files.items():
                for line in local.read_new():
                    if name not in over_ssh:
                        emit(name, line)
            if loop.time() >= discover_at:
                discover_at = loop.time() + DISCOVER_S
                try:
                    targets = await asyncio.to_thread(_targets, run, records)
                except DdctlError:
                    if first:
                        raise
                    targets = {}  # an engine or a cloud API that hiccups: look again next time
                first = False
                for name, (ident, target) in targets.items():
                    if ident not in streams:
                        over_ssh.add(name)
                        streams[ident] = asyncio.create_task(_stream(name, target, emit, SinceFilter(since)))
            await asyncio.sleep(POLL_S)
    finally:
        for task in streams.values():
            task.cancel()
        await asyncio.gather(*streams.values(), return_exceptions=True)


async def _stream(name: str, target: deploy.Target, emit: Emit, keep: SinceFilter) -> None:
    """One machine's ``agent.log`` from its first line, as it grows, until the machine goes away."""
    try:
        async for line in deploy.stream_lines(target, deploy.follow_command(deploy.AGENT_LOG)):
            if keep(line):
                emit(name, line)
    except DdctlError:
        return  # it went away before we reached it; a replacement is found by the next look


def ssh_target(run: str, state: State, name: str, instance: str = "") -> tuple[deploy.Target, Path]:
    """The SSH target of the instance ``name`` names (for a region, its first running learner, unless ``instance``
    names one of it), and the run's pinned known_hosts."""
    records = choose(run, state, name) if name else state.instances(run)
    if instance:
        records = [r for r in records if r.name == instance]
        if not records:
            where = f"region {name} of {run}" if name else f"run {run}"
            raise DdctlError(f"{where} has no instance {instance!r}; {choices(state.instances(run))}")
    records.sort(key=lambda r: r.role != "learner")
    what = name or instance
    running = _running(run, records)
    for record in records:
        if record.name in running:
            kind, found = running[record.name]
            target = providers.get(kind).ssh_target(found)
            if target is None:
                raise DdctlError(
                    f"{what} runs as a local process (provider {kind}); there is no machine to ssh into. "
                    f"Its logs: ddctl logs {what}"
                )
            return target, RunDir(run).known_hosts
    raise DdctlError(f"no instance of {what} is running right now (a replacement may be starting)")

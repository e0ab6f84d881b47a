"""``ddctl up --dry-run`` and ``ddctl down``: a job's lifecycle on local regions.

A dry run plays every region on this machine with one local provider: Docker
"VMs" (deployed over SSH, links shaped in their network namespaces) when an
engine answers, local processes otherwise, or when every region asks for
``process``. ``up`` returns once the job has merged its first round and leaves
it running under a controller. ``down`` finds everything by label (the state
file is only a cache), stops it in an order that lets learners push and leave,
and is safe to repeat.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddctl import providers
from ddctl.config.regions import RegionsFile, job_config
from ddctl.control.credentials import init_job_dir, token_for
from ddctl.control.plan import learner_names
from ddctl.control.specs import SYNCER_PORT, Topology, helper_spec, learner_spec, python, syncer_spec
from ddctl.control.state import InstanceRecord, State, run_dir
from ddctl.errors import DdctlError
from ddctl.providers import linkshape
from ddctl.providers.base import Instance, InstanceSpec, Provider
from ddctl.providers.docker.engine import engine_unavailable
from ddctl.providers.linkshape import ShapedLink
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.waiting import wait_until

STOP_ORDER = {"controller": 0, "learner": 1, "syncer": 2, "metadata": 3}
"""The controller first (it would replace what we stop), learners before the syncer they push to."""


def choose_kind(rf: RegionsFile, say: Any) -> str:
    """Docker when an engine answers (and any region is not ``process``); local processes otherwise."""
    if all(r.provider == "process" for r in rf.regions):
        return "process"
    why = engine_unavailable()
    if why:
        say(f"{why}; every region runs as local processes instead")
        return "process"
    return "docker"


def up_dry_run(
    rf: RegionsFile, state: State, timeout_s: float = 300.0, say: Any = print, kind: str | None = None
) -> dict[str, Any]:
    """Start the job locally; return once the first round has merged."""
    job = job_config(rf)
    run = f"{rf.run}-{secrets.token_hex(3)}"
    root = run_dir(run)
    kind = kind or choose_kind(rf, say)
    provider, helpers = providers.get(kind), providers.get("process")
    started = time.monotonic()
    try:
        topology = _topology(kind, rf, run, provider, say)
        init_job_dir(root / "job", job, run, topology.syncer_hosts())
        state.create_run(run, str(rf.path), str(root / "job"), {"provider": kind, "learners": rf.learners})
        runtime = python()
        if kind == "docker":
            port_file = root / "metadata.port"
            _launch(
                state,
                helpers,
                helper_spec(run, "metadata", rf.syncer, "ddctl.providers.docker.metadata", "--port-file", str(port_file)),
            )
            topology = replace(topology, metadata_port=_wait_port(port_file, root / "logs" / "metadata.log"))
            runtime = provider.image.python  # type: ignore[attr-defined]
        syncer = syncer_spec(run, topology, runtime)
        _launch(state, provider, syncer, status="starting")
        port = SYNCER_PORT if kind == "docker" else _wait_port(root / "syncer.port", syncer.log)
        url = f"https://{topology.syncer_ip(rf.syncer)}:{port}"
        (root / "syncer.url").write_text(url)
        names = learner_names(rf)
        specs = [learner_spec(run, topology, r, name, port, runtime) for r in rf.regions for name in names[r.name]]
        _launch(state, provider, *specs, status="deploying")
        first_round = _wait_first_round(root, url, timeout_s)
        state.set_run_state(run, "training")
        _launch(state, helpers, helper_spec(run, "controller", rf.syncer, "ddctl.control.controller", "--state", str(state.path)))
    except BaseException:
        down(run, state)
        raise
    seconds = round(time.monotonic() - started, 2)
    shaped = {r.name: {"up_mbps": r.link.up_mbps, "down_mbps": r.link.down_mbps} for r in rf.regions if r.link}
    if kind == "process":
        shaped = {name: shaped[name] for name in topology.netns}
    return {
        "run": run,
        "provider": kind,
        "url": url,
        "job_dir": str(root / "job"),
        "seconds_to_first_round": seconds,
        "shaped": shaped,
        **first_round,
    }


def _topology(kind: str, rf: RegionsFile, run: str, provider: Provider, say: Any) -> Topology:
    latency = [r.name for r in rf.regions if r.link is not None and r.link.latency_ms > 0]
    why = linkshape.available() if any(r.link for r in rf.regions) else None
    if why:
        say(f"links are not shaped: {why}")
    elif latency:
        say("latency_ms is not emulated: netem is not available in this kernel; bandwidths are shaped with tbf")
    if kind == "docker":
        subnets = provider.create_networks(run, [r.name for r in rf.regions])  # type: ignore[attr-defined]
        return Topology("docker", rf.syncer, subnets=subnets)
    return Topology("process", rf.syncer, netns={} if why else _shape_namespaces(rf, run))


def _shape_namespaces(rf: RegionsFile, run: str) -> dict[str, ShapedLink]:
    """One shaped namespace per region with a link profile (process regions)."""
    links = {}
    for region in rf.regions:
        if region.link is not None:
            links[region.name] = linkshape.create_link(f"ddctl-{run}-{region.name}", region.link.up_mbps, region.link.down_mbps)
    return links


def _launch(state: State, provider: Provider, *specs: InstanceSpec, status: str = "running") -> None:
    """Create the instances (in parallel: Docker VMs boot and deploy concurrently) and record each with its
    spec, from which the controller re-creates it."""
    shaped = linkshape.available() is None
    specs = tuple(spec if shaped or spec.link is None else replace(spec, link=None) for spec in specs)
    with ThreadPoolExecutor(max_workers=4) as pool:
        instances = list(pool.map(provider.create, specs))
    for spec, instance in zip(specs, instances, strict=True):
        state.put_instance(
            InstanceRecord(
                spec.run,
                spec.name,
                spec.region,
                provider.kind,
                spec.role,
                status,
                instance.provider_id,
                time.time(),
                {"spec": spec.to_json(), "log": str(spec.log)},
            )
        )


def _wait_port(port_file: Path, log: Path, timeout_s: float = 120.0) -> int:
    def port() -> str:
        return port_file.read_text().strip() if port_file.exists() else ""

    return int(
        wait_until(
            port, timeout_s=timeout_s, every_s=0.05, what=f"a port in {port_file}", error=lambda m: DdctlError(f"{m}; see {log}")
        )
    )


def admin_client(root: Path, url: str | None = None, timeout_s: float = 30.0) -> SyncerClient:
    """A client of the run's syncer with the admin token (``url`` defaults to the one ``up`` recorded)."""
    url = url or (root / "syncer.url").read_text().strip()
    return SyncerClient(url, token_for(root / "job", "admin"), root / "job" / "tls" / "ca.pem", timeout_s=timeout_s)


def _wait_first_round(root: Path, url: str, timeout_s: float) -> dict[str, Any]:
    client = admin_client(root, url)

    def merged() -> dict[str, Any] | None:
        try:
            status = client.status()
        except Unavailable:
            return None
        return {"rounds": status["rounds"], "live": status["live"]} if status["rounds"] >= 1 else None

    try:
        return wait_until(
            merged,
            timeout_s=timeout_s,
            every_s=0.2,
            what="the first merged round",
            error=lambda m: DdctlError(f"{m}; logs in {root / 'logs'}"),
        )
    finally:
        client.close()


def latest_run(state: State, run: str | None) -> str:
    if run:
        return run
    runs = [r for r in state.runs() if r.state != "down"]
    if not runs:
        raise DdctlError("no run is up; start one with: ddctl up --dry-run")
    return runs[-1].id


def run_providers() -> list[Provider]:
    """Every local provider that can hold a run's instances here (Docker only when an engine answers)."""
    return [providers.get("process"), *([providers.get("docker")] if engine_unavailable() is None else [])]


def down(run: str, state: State, grace_s: float = 15.0) -> dict[str, Any]:
    """Stop every instance labelled with ``run``, in ``STOP_ORDER``, and what they leave behind; idempotent."""
    found: list[tuple[Provider, Instance]] = [(p, i) for p in run_providers() for i in p.list_run(run)]
    roles = {r.name: r.role for r in state.instances(run)}

    def rank(item: tuple[Provider, Instance]) -> int:
        name = item[1].name
        return STOP_ORDER.get(roles.get(name, name), STOP_ORDER["learner"])

    for stage in sorted({rank(item) for item in found}):
        batch = [item for item in found if rank(item) == stage]
        with ThreadPoolExecutor(max_workers=8) as pool:  # learners leave in parallel
            list(pool.map(lambda item: item[0].terminate(item[1], grace_s), batch))
    removed = [name for p in run_providers() for name in p.cleanup(run)]
    left = [i.name for p in run_providers() for i in p.list_run(run)]
    if left:
        raise DdctlError(f"{len(left)} instances of {run} survived termination: {left}")
    if state.run(run) is not None:
        state.set_run_state(run, "down")
    return {"run": run, "stopped": [i.name for _, i in found], "removed": removed}

"""``ddctl up --dry-run`` / ``status`` / ``down`` / ``logs`` for local regions.

A dry run plays every region on this machine: the syncer and each learner are
labelled local instances (``process`` provider), deployed from the job
directory ddctl writes under the data directory. ``up`` returns once the job
has merged its first round and leaves it running; ``status`` asks the syncer;
``down`` finds everything by label (the state file is only a cache), stops it
and is safe to repeat.
"""

from __future__ import annotations

import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ddctl import linkshape
from ddctl.credentials import init_job_dir, token_for
from ddctl.errors import DdctlError
from ddctl.linkshape import ShapedLink
from ddctl.plan import learner_names
from ddctl.providers.base import Instance, InstanceSpec
from ddctl.providers.process import ProcessProvider
from ddctl.regions import RegionsFile, job_config
from ddctl.state import InstanceRecord, State, data_dir
from ddctl_agents.agent.client import SyncerClient, Unavailable


def run_dir(run: str) -> Path:
    return data_dir() / "runs" / run


def docker_available() -> bool:
    return Path("/var/run/docker.sock").exists() and shutil.which("docker") is not None


def up_dry_run(rf: RegionsFile, state: State, timeout_s: float = 300.0, say: Any = print) -> dict[str, Any]:
    """Start the job locally; return once the first round has merged."""
    job = job_config(rf)
    run = f"{rf.run}-{secrets.token_hex(3)}"
    root = run_dir(run)
    say("docker regions are not available in this build; every region runs as local processes")
    provider = ProcessProvider()
    started = time.monotonic()
    try:
        links = _shape_links(rf, run, say)
        hosts = sorted({"127.0.0.1", "localhost", *(link.host_ip for link in links.values())})
        init_job_dir(root / "job", job, run, hosts)
        state.create_run(run, str(rf.path), str(root / "job"), {"provider": "process", "learners": rf.learners})
        port = _start_syncer(run, root, provider, state, rf.syncer, bind="0.0.0.0" if links else "127.0.0.1")
        url = f"https://127.0.0.1:{port}"
        for region_name, names in learner_names(rf).items():
            link = links.get(region_name)
            for learner in names:
                _start_learner(run, root, provider, state, port, region_name, learner, link)
        first_round = _wait_first_round(root, url, timeout_s)
        state.set_run_state(run, "training")
        _start_controller(run, root, provider, state, rf.syncer)
    except BaseException:
        down(run, state)
        raise
    seconds = round(time.monotonic() - started, 2)
    shaped = {name: {"up_mbps": link.up_mbit, "down_mbps": link.down_mbit} for name, link in links.items()}
    return {
        "run": run,
        "url": url,
        "job_dir": str(root / "job"),
        "seconds_to_first_round": seconds,
        "shaped": shaped,
        **first_round,
    }


def _shape_links(rf: RegionsFile, run: str, say: Any) -> dict[str, ShapedLink]:
    """One shaped namespace per region with a link profile, when this machine allows it."""
    wanted = [r for r in rf.regions if r.link is not None]
    if not wanted:
        return {}
    why = linkshape.available()
    if why:
        say(f"links are not shaped: {why}")
        return {}
    if any(r.link is not None and r.link.latency_ms > 0 for r in wanted):
        say("latency_ms is not emulated: netem is not available in this kernel; bandwidths are shaped with tbf")
    links = {}
    for region in wanted:
        assert region.link is not None
        links[region.name] = linkshape.create_link(_netns(run, region.name), region.link.up_mbps, region.link.down_mbps)
    return links


def _netns(run: str, region: str) -> str:
    return f"ddctl-{run}-{region}"


def _python() -> list[str]:
    return [sys.executable, "-m"]


def _start_controller(run: str, root: Path, provider: ProcessProvider, state: State, region: str) -> None:
    argv = (*_python(), "ddctl.controller", "--run", run, "--state", str(state.path))
    spec = InstanceSpec(
        run=run, name="controller", region=region, role="controller", argv=argv, log=root / "logs" / "controller.log"
    )
    _record(state, spec, provider.create(spec), "running")


def _start_syncer(run: str, root: Path, provider: ProcessProvider, state: State, region: str, bind: str) -> int:
    port_file = root / "syncer.port"
    argv = (
        *_python(),
        "ddctl_agents.service",
        "--job-dir",
        str(root / "job"),
        "--bind",
        f"{bind}:0",
        "--port-file",
        str(port_file),
    )
    spec = InstanceSpec(
        run=run, name="syncer", region=region, role="syncer", argv=(*argv, "--eval-every", "30"), log=root / "logs" / "syncer.log"
    )
    _record(state, spec, provider.create(spec), "starting", port_file=str(port_file))
    deadline = time.monotonic() + 120
    while not port_file.exists() or not port_file.read_text().strip():
        if time.monotonic() > deadline:
            raise DdctlError(f"the syncer did not start; see {spec.log}")
        time.sleep(0.05)
    return int(port_file.read_text())


def _start_learner(
    run: str, root: Path, provider: ProcessProvider, state: State, port: int, region: str, learner: str, link: ShapedLink | None
) -> None:
    """A learner of ``region``; inside its shaped namespace when it has one, reaching the syncer across it."""
    url = f"https://{link.host_ip if link else '127.0.0.1'}:{port}"
    token_file = root / "tokens" / learner
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(token_for(root / "job", learner))
    token_file.chmod(0o600)
    argv = (
        *(link.command() if link else ()),
        *_python(),
        "ddctl_agents.agent",
        "--syncer",
        url,
        "--name",
        learner,
        "--token-file",
        str(token_file),
        "--ca",
        str(root / "job" / "tls" / "ca.pem"),
        "--region",
        region,
        "--syncer-timeout",
        "120",
        "--summary",
        str(summary_path(run, learner)),
    )
    spec = InstanceSpec(run=run, name=learner, region=region, role="learner", argv=argv, log=root / "logs" / f"{learner}.log")
    _record(state, spec, provider.create(spec), "deploying", summary=str(summary_path(run, learner)))


def summary_path(run: str, learner: str) -> Path:
    """Where a learner writes its exit summary; a ``finished`` one is never replaced."""
    return run_dir(run) / "summaries" / f"{learner}.json"


def _record(state: State, spec: InstanceSpec, instance: Instance, status: str, **detail: str) -> None:
    state.put_instance(
        InstanceRecord(
            spec.run,
            spec.name,
            spec.region,
            "process",
            spec.role,
            status,
            instance.provider_id,
            time.time(),
            {"log": str(spec.log), "argv": list(spec.argv), **detail},
        )
    )


def admin_client(root: Path, url: str) -> SyncerClient:
    return SyncerClient(url, token_for(root / "job", "admin"), root / "job" / "tls" / "ca.pem")


def _wait_first_round(root: Path, url: str, timeout_s: float) -> dict[str, Any]:
    client = admin_client(root, url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                status = client.status()
                if status["rounds"] >= 1:
                    return {"rounds": status["rounds"], "live": status["live"]}
            except Unavailable:
                pass
            if time.monotonic() > deadline:
                raise DdctlError(f"no round merged within {timeout_s:.0f}s; logs in {root / 'logs'}")
            time.sleep(0.2)
    finally:
        client.close()


def latest_run(state: State, run: str | None) -> str:
    if run:
        return run
    runs = [r for r in state.runs() if r.state != "down"]
    if not runs:
        raise DdctlError("no run is up; start one with: ddctl up --dry-run")
    return runs[-1].id


def status(run: str, state: State) -> dict[str, Any]:
    """The run as the issue's JSON: run, rounds, and regions with their learners."""
    record = state.run(run)
    if record is None:
        raise DdctlError(f"no run {run!r} in {state.path}")
    root = run_dir(run)
    port = int((root / "syncer.port").read_text())
    client = admin_client(root, f"https://127.0.0.1:{port}")
    try:
        live = client.status()
    except Unavailable as exc:
        raise DdctlError(f"the syncer of {run} is unreachable: {exc}") from None
    finally:
        client.close()
    by_name = {entry["id"]: entry for entry in live["learners"]}
    regions: dict[str, dict[str, Any]] = {}
    for inst in state.instances(run):
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


def down(run: str, state: State, grace_s: float = 15.0) -> dict[str, Any]:
    """Stop every instance labelled with ``run`` (learners first, so they push and leave); idempotent."""
    provider = ProcessProvider()
    found = provider.list_run(run)
    order = {"controller": 0, "syncer": 2}  # the controller first (it would replace what we stop), the syncer last
    for inst in sorted(found, key=lambda i: order.get(i.name, 1)):
        provider.terminate(inst, grace_s)
    left = provider.list_run(run)
    if left:
        raise DdctlError(f"{len(left)} instances of {run} survived termination: {[i.name for i in left]}")
    removed_links = linkshape.namespaces(f"ddctl-{run}-") if linkshape.available() is None else []
    for name in removed_links:
        linkshape.destroy_link(name)
    if state.run(run) is not None:
        state.set_run_state(run, "down")
    return {"run": run, "stopped": [i.name for i in found], "links_removed": removed_links}


def logs(run: str, state: State, region: str) -> dict[str, str]:
    chosen = [i for i in state.instances(run) if i.region == region]
    if not chosen:
        regions = sorted({i.region for i in state.instances(run)})
        raise DdctlError(f"run {run} has no region {region!r}; regions: {', '.join(regions)}")
    return {i.name: Path(i.detail["log"]).read_text(errors="replace") if Path(i.detail["log"]).exists() else "" for i in chosen}

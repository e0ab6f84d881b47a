"""``ddctl up``: a run converges to its plan, on any provider, and says what it changed.

The run id is the regions file's ``run:``. ``up`` bootstraps each provider's
regions (idempotent), makes the job directory once, then reconciles the plan
against what runs (``control/reconcile.py``): it creates what is missing and
nothing twice, waits for the first merged round, and makes sure the controller
runs. ``up`` on a live run only fills the gaps. A dry run plays every region on
one local provider (Docker VMs when an engine answers, else processes). A fresh
``up`` that fails or is interrupted removes what it made (``down``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ddctl import providers
from ddctl.config import synchronizer
from ddctl.config.regions import RegionsFile, job_config
from ddctl.control import admission, relays
from ddctl.control import pull as pulling
from ddctl.control.credentials import init_job_dir, token_for
from ddctl.control.down import down
from ddctl.control.jobdata import check_data, local_data
from ddctl.control.launch import launch_at
from ddctl.control.plan import PlannedInstance, desired, plan, plan_summary, shard_map, syncer_shards
from ddctl.control.quotes import quote_plan
from ddctl.control.reconcile import Action, Desired, Memory, Observed, reconcile, remember
from ddctl.control.rundir import RunDir
from ddctl.control.runs import ENDED
from ddctl.control.specs import (
    SHARD_MAP,
    helper_spec,
    learner_spec,
    rendezvous_port,
    syncer_port,
    syncer_spec,
    with_rendezvous,
)
from ddctl.control.state import InstanceRecord, State
from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers import linkshape
from ddctl.providers.base import Instance, InstanceSpec, Provider, RegionInfo, joined_shard_hosts
from ddctl_agents import storage
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.waiting import wait_until

TRANSIENT_TRIES = 3
"""A create refused as transient (throttling, 5xx) is retried this many times, backed off, before ``up`` gives up."""


def kinds_for(rf: RegionsFile, dry_run: bool, say: Any = print) -> dict[str, str]:
    """Each region's provider: its own, or for a dry run the one local provider that plays them all."""
    if not dry_run:
        providers.require_built(r.provider for r in rf.regions)  # before anything is made or archived
        home = rf.region(rf.syncer)
        clouds = sorted({r.provider for r in rf.regions if not providers.KINDS[r.provider].local})
        if clouds and providers.KINDS[home.provider].local:
            raise DdctlError(
                f"{rf.path}: syncer: {home.name!r} is a {home.provider} region on this machine, which {' and '.join(clouds)} "
                "VMs cannot reach; put the syncer in a cloud region (learners on this machine reach it there)"
            )
        return {r.name: r.provider for r in rf.regions}
    kind, note = providers.dry_run_kind({r.provider for r in rf.regions})
    if note:
        say(note)
    return dict.fromkeys((r.name for r in rf.regions), kind)


def observe(run: str, kinds: set[str]) -> list[Observed]:
    """What runs of ``run`` now, on every provider it uses (read only)."""
    return [Observed(name=i.name, alive=i.alive) for kind in sorted(kinds) for i in providers.get(kind).list_run(run)]


def up(
    rf: RegionsFile,
    state: State,
    *,
    dry_run: bool,
    keep: bool = False,
    resume_from: str = "",
    timeout_s: float = 300.0,
    say: Any = print,
) -> dict[str, Any]:
    """Converge ``rf.run`` to its plan; return once its first round has merged.

    ``keep``: when the job finishes, its machines stay (for inspection) until ``ddctl down``.
    ``resume_from``: a checkpoint (or checkpoints folder: its newest) a new run's syncer starts from."""
    job = job_config(rf)
    kinds = kinds_for(rf, dry_run, say)
    runnable = synchronizer.runnable_plan(rf, job, kinds)
    cadence = runnable.cadence  # each region's learners send every k periods, as planned
    check_data(job, kinds)
    run, rundir = rf.run, RunDir(rf.run)
    record = state.run(run)
    if record is not None and record.state == "kept":
        raise DdctlError(f"run {run} finished and its machines were kept; remove them first: ddctl down --run {run}")
    fresh = record is None or record.state in ENDED
    if resume_from and not fresh:
        raise DdctlError(f"run {run} is {record.state}; --resume-from starts a new run: `ddctl down --run {run}` first")  # type: ignore[union-attr]
    resumed = pulling.resume_point(resume_from, job.inner) if resume_from else None  # before anything
    started = time.monotonic()
    try:
        if fresh:
            _archive(run, state)
        owners = {kind: providers.get(kind) for kind in set(kinds.values())}
        infos = _bootstrap(rf, kinds, owners, say)
        if fresh:  # the job (its secret, CA and certificate) is made once; a converging up keeps it
            shards = syncer_shards(rf)
            addresses = {info.shard_host(i) for info in infos.values() for i in range(len(shards))}  # every shard's
            init_job_dir(rundir.job, job, run, sorted({"127.0.0.1", "localhost", *addresses}))
            if resumed is not None:
                pulling.stage(resumed[0], rundir)
                say(f"resuming from {resumed[1]['checkpoint']} of run {resumed[1]['run']} (round {resumed[1]['rounds']})")
            ports = {s.name: syncer_port(infos[s.region]) for s in shards}
            port = ports["syncer"]
            cost = plan_summary(rf, kinds, quotes=quote_plan(rf, kinds))["cost"]  # today's prices, read-only
            rate = None if cost["unknown"] else cost["total_dollars_per_hour"]
            detail = {"kinds": kinds, "learners": rf.learners, "port": port, "keep": keep, "dollars_per_hour": rate}
            detail |= {"shard_ports": ports} if len(shards) > 1 else {}
            detail |= {"checkpoint_url": storage.join(rf.checkpoints.url, run)} if rf.checkpoints.url else {}
            detail |= {"resumed_from": resumed[1]} if resumed is not None else {}
            state.create_run(run, str(rf.path), str(rundir.job), detail)
            rundir.syncer_url.write_text(f"https://{infos[rf.syncer].syncer_host}:{port}")
            if len(shards) > 1:  # every shard serves the plan's map; this machine reaches each at its region's address
                (rundir.job / SHARD_MAP).write_text(json.dumps(shard_map(rf).to_json()))
                urls = [f"https://{infos[s.region].shard_host(i)}:{ports[s.name]}" for i, s in enumerate(shards)]
                rundir.shard_urls.write_text("".join(f"{url}\n" for url in urls))
            say(f"made the job directory {rundir.job} (secret, CA, certificate)")
        else:
            detail = record.detail  # type: ignore[union-attr]  # not fresh: the record exists
            ports = {str(k): int(v) for k, v in detail.get("shard_ports", {"syncer": detail["port"]}).items()}
            state.update_run_detail(run, {"keep": keep})
        planned = plan(rf, kinds)
        meets = {i.learner: rendezvous_port(infos[i.region]) for i in planned if i.nodes > 1 and i.node == 0}
        mounts = local_data(job)
        relay_ports = relays.ports(run, state, planned, infos)
        specs = {i.name: _spec(run, i, infos, rf, ports, meets.get(i.learner, 0), mounts, cadence, relay_ports) for i in planned}
        actions = reconcile(desired(planned, finished_instances(state, run)), observe(run, set(kinds.values())), time.time())
        changed = _carry_out(state, owners, planned, specs, actions, say)
        say("waiting for the first merged round")
        syncers = {i.name: owners[i.provider] for i in planned if i.role == "syncer"}
        first_round = wait_first_round(run, timeout_s, lambda: _exited(run, syncers))
        state.set_run_state(run, "training")
        _ensure_controller(run, state, say)
    except BaseException:
        if fresh:
            down(run, state)
        raise
    shaped = {name: {"up_mbps": info.shaped[0], "down_mbps": info.shaped[1]} for name, info in infos.items() if info.shaped}
    return {
        "run": run,
        "provider": ",".join(sorted(set(kinds.values()))),
        "url": rundir.syncer_url.read_text(),
        **({"shards": rundir.urls()} if rundir.shard_urls.is_file() else {}),
        "job_dir": str(rundir.job),
        "changed": [{"action": a.kind, "instance": a.name, "reason": a.reason} for a in changed],
        "seconds_to_first_round": round(time.monotonic() - started, 2),
        "shaped": shaped,
        **first_round,
        **({"resumed_from": resumed[1]} if resumed is not None else {}),
    }


def _archive(run: str, state: State) -> None:
    """A fresh run under an old name: the old run's directory is kept aside, its records forgotten."""
    root = RunDir(run).root
    if root.exists():
        shutil.move(root, root.with_name(f"{run}.{time.strftime('%Y%m%dT%H%M%S')}"))
    if state.run(run) is not None:
        state.delete_run(run)


def _admitter(run: str, owners: dict[str, Provider], planned: list[PlannedInstance]) -> Callable[[Instance], object] | None:
    """What opens the syncer's port (every cloud shard's) to a new learner (``control/admission.py``); None where the
    synchronizer is local."""
    clouds = sorted({i.provider for i in planned if i.role == "syncer" and not providers.KINDS[i.provider].local})
    if not clouds:
        return None
    regions = {i.name: i.region for i in planned if i.role == "learner"}
    return lambda _: admission.admit(run, [owners[kind] for kind in clouds], owners, regions)


def _bootstrap(rf: RegionsFile, kinds: dict[str, str], owners: dict[str, Provider], say: Any) -> dict[str, RegionInfo]:
    linked = [r.name for r in rf.regions if r.link is not None]
    why = linkshape.available() if linked else None
    if why:
        say(f"links are not shaped: {why}")
    elif any(r.link is not None and r.link.latency_ms > 0 for r in rf.regions):
        say("latency_ms is not emulated: netem is not available in this kernel; bandwidths are shaped with tbf")
    infos: dict[str, RegionInfo] = {}
    home = kinds[rf.syncer]  # first: the syncer's address is what every other cloud's learners are told
    shards = syncer_shards(rf)
    shard_regions = tuple(s.region for s in shards) if len(shards) > 1 else ()
    for kind in sorted(owners, key=lambda k: k != home):
        regions = [r for r in rf.regions if kinds[r.name] == kind]
        say(f"bootstrapping the {kind} regions {', '.join(r.name for r in regions)}")
        host = "" if kind == home else infos[rf.syncer].syncer_host
        infos.update(owners[kind].bootstrap(rf.run, regions, rf.syncer, host, shard_regions))
    return joined_shard_hosts(infos, shard_regions)


def _spec(
    run: str,
    planned: PlannedInstance,
    infos: dict[str, RegionInfo],
    rf: RegionsFile,
    ports: dict[str, int],
    meet: int,
    mounts: tuple[str, ...],
    cadence: dict[str, int],
    relay_ports: dict[str, int],
) -> InstanceSpec:
    """``ports``: each synchronizer process's (one, or one per shard in shard order); ``relay_ports``: each relayed
    region's relay port."""
    info, region = infos[planned.region], rf.region(planned.region)
    if planned.role == "syncer":
        spec = syncer_spec(run, info, ports[planned.name], region, rf.checkpoints, (planned.name, planned.shard))
    else:
        at, relay = tuple(ports.values()), (planned.relay, relay_ports.get(planned.region, 0))
        spec = learner_spec(run, info, region, planned.learner, at, planned.node, meet, cadence[planned.region], relay)
    return replace(spec, mounts=mounts)


def _carry_out(
    state: State,
    owners: dict[str, Provider],
    planned: list[PlannedInstance],
    specs: dict[str, InstanceSpec],
    actions: list[Action],
    say: Any,
) -> list[Action]:
    """Start the syncer, then every learner in parallel (Docker VMs boot and deploy concurrently); record each.

    A learner over several VMs starts as one: node 0, then the rest pointed at its address, all at one
    placement; a refusal of any takes the started ones down and fails the whole learner over."""
    by_name = {i.name: i for i in planned}
    starting = [a for a in actions if a.kind in ("create", "replace")]
    refusals: list[tuple[str, str, ProvisionError]] = []
    admit = _admitter(_run_of(specs), owners, planned)
    survivors = {a.name for a in actions if a.kind == "terminate" and a.name in by_name}
    for kind in sorted({by_name[name].provider for name in survivors}):  # a learner's VMs that outlived one of theirs
        for instance in [i for i in owners[kind].list_run(_run_of(specs)) if i.name in survivors]:
            owners[kind].terminate(instance)  # it is started again as a whole

    def start(gang: list[Action]) -> list[tuple[InstanceSpec, Instance]]:
        """Launch at the lead's placement; on a refusal, fail over as the controller would (next zone, region)."""
        lead, memory = by_name[gang[0].name], Memory()
        provider, placement = owners[lead.provider], gang[0].placement
        while True:
            started: list[tuple[InstanceSpec, Instance]] = []
            try:
                for action in gang:
                    spec = (
                        specs[action.name] if not started else with_rendezvous(specs[action.name], started[0][1].private_address)
                    )
                    started.append(launch_at(provider, spec, placement, admit if lead.role == "learner" else None))
            except ProvisionError as error:  # a provider's refusal, classified: what failover decides on
                for _, instance in started:
                    provider.terminate(instance, grace_s=0.0)
                refusals.append((gang[len(started)].name, str(placement), error))
                memory = remember(memory, replace(gang[0], placement=placement), error, time.time())
                if error.kind == "transient" and memory.failures.get(lead.name, 0) <= TRANSIENT_TRIES:
                    time.sleep(max(memory.retry_at[lead.name] - time.time(), 0.0))  # backed off: the same placement again
                    continue
                [action] = reconcile(
                    [Desired(name=lead.name, role=lead.role, placements=lead.placements)], [], time.time(), memory
                )
                if action.kind not in ("create", "replace"):
                    raise error from None
                say(f"{lead.name}: {error.kind} ({error.code or 'refused'}) at {refusals[-1][1]}; trying {action.placement}")
                placement = action.placement
                continue
            for spec, _ in started:
                say(f"{spec.name} deployed in {spec.region}")  # from a worker thread, as each finishes
            return started

    if not starting:
        say("every instance already runs")
    syncers = [a for a in starting if by_name[a.name].role == "syncer"]
    served = [a for a in starting if by_name[by_name[a.name].learner or a.name].relay == "served"]  # a learner's VMs
    learners = [a for a in starting if a not in syncers and a not in served]  # relay hosts among them
    addresses: dict[str, str] = {}
    for group in (syncers, learners, served):
        if group is served:  # the relay hosts are up: their region's other learners reach each relay at its address
            relays.point_at(_run_of(specs), owners, planned, specs, addresses, [a.name for a in served])
        if group:
            why = " (their regions' relays are up)" if group is served else ""
            say(f"starting {', '.join(a.name for a in group)}{' in parallel' if len(group) > 1 else ''}{why}")
        gangs: dict[str, list[Action]] = {}
        for action in group:
            gangs.setdefault(by_name[action.name].learner or action.name, []).append(action)
        with ThreadPoolExecutor(max_workers=4) as pool:
            try:
                started = [pair for pairs in pool.map(start, gangs.values()) for pair in pairs]
            finally:  # the state file is written on this thread: every refusal, with its reason, in the event log
                for name, where, error in refusals:
                    state.event(_run_of(specs), "provision-failed", instance=name, error=error.kind, code=error.code,
                                reason=f"at {where}: {error}")  # fmt: skip
                refusals.clear()
        ordered = [action for gang in gangs.values() for action in gang]
        for action, (spec, instance) in zip(ordered, started, strict=True):  # the state file is written on this thread
            item = by_name[action.name]
            addresses[item.name] = instance.private_address
            placements = [{"provider": p.provider, "cloud_region": p.cloud_region, "zone": p.zone} for p in item.placements]
            detail: dict[str, Any] = {"spec": spec.to_json(), "log": str(spec.log), "placements": placements}
            detail["started_at"] = time.time()  # the controller reads how long its agent lived (``reconcile.ended``)
            if item.nodes > 1:  # which learner's VMs live and die together (the controller reads it)
                detail |= {"learner": item.learner, "node": item.node}
            detail |= {"relay": item.relay} if item.relay else {}  # the controller points replacements at the host
            status = "starting" if item.role == "syncer" else "deploying"
            at, vm = detail["started_at"], instance.provider_id
            state.put_instance(InstanceRecord(spec.run, spec.name, spec.region, item.provider, item.role, status, vm, at, detail))
            state.event(spec.run, "created", instance=spec.name, region=spec.region, reason=action.reason)
    return starting


def _run_of(specs: dict[str, InstanceSpec]) -> str:
    return next(iter(specs.values())).run


def admin_client(run: str, timeout_s: float = 30.0, url: str = "") -> SyncerClient:
    """A client of the run's syncer (or of its process at ``url``: one shard of a sharded one) with the admin token."""
    rundir = RunDir(run)
    url = url or rundir.syncer_url.read_text().strip()
    return SyncerClient(url, token_for(rundir.job, "admin"), rundir.ca, timeout_s=timeout_s)


def _exited(run: str, syncers: dict[str, Provider]) -> list[str]:
    """The synchronizer processes that are no longer running (a refused flag, a broken job): waiting is pointless."""
    alive = {i.name for provider in set(syncers.values()) for i in provider.list_run(run) if i.alive}
    return sorted(set(syncers) - alive)


def wait_first_round(run: str, timeout_s: float, exited: Callable[[], list[str]] = list) -> dict[str, Any]:
    """The first merged round's figures; an error as soon as ``exited`` names a synchronizer process that left."""
    client = admin_client(run)

    def merged() -> dict[str, Any] | None:
        try:
            status = client.status()
        except Unavailable:
            if gone := exited():
                raise late(f"{', '.join(gone)} exited before the first merged round") from None
            return None
        return {"rounds": status["rounds"], "live": status["live"]} if status["rounds"] >= 1 else None

    def late(message: str) -> DdctlError:
        return DdctlError(f"{message}; logs in {RunDir(run).root / 'logs'}")

    try:
        return wait_until(merged, timeout_s=timeout_s, every_s=0.2, what="the first merged round", error=late)
    finally:
        client.close()


def _ensure_controller(run: str, state: State, say: Any) -> None:
    helpers = providers.get("process")
    if any(i.name == "controller" and i.alive for i in helpers.list_run(run)):
        return
    say("starting the controller (it replaces preempted learners)")
    spec = helper_spec(run, "controller", "", "ddctl.control.controller", "--state", str(state.path))
    instance = helpers.create(spec)
    record = InstanceRecord(
        run,
        "controller",
        "",
        "process",
        "controller",
        "running",
        instance.provider_id,
        time.time(),
        {"spec": spec.to_json(), "log": str(spec.log)},
    )
    state.put_instance(record)


def finished_instances(state: State | None, run: str) -> set[str]:
    """A live run's instances whose work is done (a learner that trained its share): converging never starts them
    again. None for a new run, an ended one (``up`` starts it afresh) or no state file."""
    record = None if state is None else state.run(run)
    if state is None or record is None or record.state in ENDED:
        return set()
    return {r.name for r in state.instances(run) if r.state == "finished"}


def plan_actions(rf: RegionsFile, *, dry_run: bool, say: Any = print, state: State | None = None) -> dict[str, Any]:
    """``up --plan``: the plan, what ``up`` would do about each instance given what runs now, and what it costs (read only)."""
    kinds = kinds_for(rf, dry_run, say)
    job = job_config(rf)
    check_data(job, kinds)
    done = finished_instances(state, rf.run)
    actions = reconcile(desired(plan(rf, kinds), done), observe(rf.run, set(kinds.values())), time.time())
    return plan_summary(rf, kinds, actions, quote_plan(rf, kinds), done) | {"synchronizer": synchronizer.summary(rf, job)}

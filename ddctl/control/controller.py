"""The controller: keeps a run's observed instances equal to the desired ones, with failover.

Every second it observes (each provider's labelled instances, each ended
learner's exit summary), asks ``reconcile`` what to do, does it, and records
every action with its reason in the run's event log (which the dashboard
shows). A syncer that died is started again where it was, on the port its
learners know, and recovers from its snapshot and log; a learner that is gone
without having finished its budget gets a replacement with the same name (the
same data shard) that rejoins as a new incarnation; a learner over several VMs
is replaced as a whole (``reconcile._gang``), node 0 first. When a provider refuses,
its classified error is remembered (``reconcile.remember``): the next pass
tries the next zone or region, waits out a quota, stops a cloud whose
credentials fail, or backs off a transient error. A sharded run's re-planner
and checkpoint schedule run beside it (``control/run_replanning.py``,
``control/run_checkpoints.py``), and its end is the shards' ends
joined into one result and one model (``control/shard_end.py``). Runs as
``python -m ddctl.control.controller --run RUN`` beside the job.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from ddctl import providers
from ddctl.control import admission, relays, run_checkpoints, run_replanning
from ddctl.control.down import searched
from ddctl.control.finish import ask_to_stop, conclude, parse_result
from ddctl.control.given_up import EndWithoutGivenUp
from ddctl.control.launch import launch_at
from ddctl.control.reconcile import Action, Desired, Memory, Observed, Placement, ended, reconcile, remember
from ddctl.control.rundir import TAPE
from ddctl.control.specs import with_relay, with_rendezvous
from ddctl.control.state import GIVEN_UP, InstanceRecord, State
from ddctl.errors import DdctlError, ProvisionError
from ddctl.providers.base import Instance, InstanceSpec, Provider
from ddctl.providers.deploy import TooLarge
from ddctl_agents.agent.client import Unavailable
from ddctl_agents.core.ending import FINISHED, STOPPED
from ddctl_agents.core.text import printable
from ddctl_agents.entrypoint import add_label_option, configure_logging

log = logging.getLogger(__name__)
AGENTS = ("syncer", "learner")


def finished(summary: bytes | None) -> bool:
    """True when the learner's exit summary says its work is done: its budget trained, or the job stopped (no replacement).

    The summary is another machine's answer: anything but a JSON object (torn, a list, nested past the stack) means
    not finished, logged escaped, so the learner is replaced rather than the controller stopped."""
    if summary is None:
        return False
    try:
        data = json.loads(summary)
    except (ValueError, RecursionError) as exc:
        log.warning("an exit summary that is not JSON is taken as not finished: %s", printable(str(exc)))
        return False
    if not isinstance(data, dict):
        log.warning("an exit summary that is a JSON %s, not an object, is taken as not finished", type(data).__name__)
        return False
    return data.get("reason") in (FINISHED, STOPPED)


@dataclass
class Controller:
    """One run's reconcile loop; ``owners`` maps a provider kind to the provider (injectable for tests)."""

    run: str
    state: State
    owners: dict[str, Provider] = field(default_factory=dict)
    memory: Memory = field(default_factory=Memory)
    said: dict[str, str] = field(default_factory=dict)
    """The last reason recorded per instance: a wait is logged when its reason changes, not every second."""
    admitted: dict[str, str] | None = None
    """The learners the syncer's port was last opened to (``control/admission.py``); None: not yet this process."""
    hosts: dict[str, str] = field(default_factory=dict)
    """A learner over several VMs -> the address its node 0 came up at in this pass (where the others meet)."""
    relay_hosts: dict[str, str] = field(default_factory=dict)
    """A relayed region -> the address of the learner that hosts its relay (``control/relays.py``), in this pass."""
    ending: EndWithoutGivenUp = field(default_factory=lambda: EndWithoutGivenUp(ask_to_stop))

    def provider(self, kind: str) -> Provider:
        if kind not in self.owners:
            self.owners[kind] = providers.get(kind)
        return self.owners[kind]

    def once(self, now: float | None = None) -> list[Action]:
        """One pass: observe, decide, act, record; returns the actions taken (none once the job has finished)."""
        now = time.time() if now is None else now
        records = {r.name: r for r in self.state.instances(self.run) if r.role in AGENTS}
        listed: dict[str, Instance] = {}
        for kind in sorted({r.provider for r in records.values()}):
            listed.update({i.name: i for i in self.provider(kind).list_run(self.run) if i.name in records})
        in_shard_order = sorted(records, key=lambda name: (len(name), name))  # syncer, syncer-s1, ..
        syncers = [records[name] for name in in_shard_order if records[name].role == "syncer"]
        if syncers and all(r.name in listed for r in syncers) and self._concluded(syncers, listed):
            return []
        desired, observed, unsure = [], [], set[str]()
        self.hosts, self.relay_hosts = {}, relays.host_addresses(records, listed)
        for name, r in records.items():
            gang = {"group": r.detail["learner"], "node": int(r.detail.get("node", 0))} if "learner" in r.detail else {}
            instance = listed.get(name)
            if instance is None and r.state != "finished" and _left_finished(r):  # a process leaves no listing
                r = records[name] = replace(r, state="finished", updated=now)
                self.state.put_instance(r)
            desired.append(
                Desired(name=name, role=r.role, placements=_placements(r), done=r.state == "finished",
                        given_up=r.state == GIVEN_UP, **gang)
            )  # fmt: skip
            if instance is not None:
                try:
                    over = self._finished(r, instance)
                except Exception as exc:  # noqa: BLE001 - one instance's bad answer must not hold up the others
                    unsure.add(_group(r))
                    self._unsure(r, exc)
                    over = False
                observed.append(Observed(name=name, alive=instance.alive, finished=over))
        self._count_ends(records, listed, {o.name for o in observed if o.finished} | unsure, now)
        actions = [a for a in reconcile(desired, observed, now, self.memory) if _group(records[a.name]) not in unsure]
        done = {o.name for o in observed if o.finished}
        for action in actions:
            self._act(action, records[action.name], listed.get(action.name), now, action.name in done)
        self.ending.once(self.run, self.state, self.state.instances(self.run))
        started = any(a.kind in ("create", "replace") for a in actions)  # they opened it themselves; ``listed`` is stale
        clouds = sorted({r.provider for r in records.values() if r.role == "syncer" and not providers.KINDS[r.provider].local})
        if clouds and not started:
            self._admit(records, listed, clouds)
        return actions

    def _count_ends(self, records: dict[str, InstanceRecord], listed: dict[str, Instance], over: set[str], now: float) -> None:
        """Each agent (a learner over several VMs as one) that ended or vanished before its work was done, folded into
        failover's memory with when its incarnation started (``reconcile.ended``: quick ends in a row back off)."""
        starts: dict[str, float] = {}  # a group's incarnation: its latest start (its VMs start together)
        down: set[str] = set()
        for name, r in records.items():
            started = r.detail.get("started_at", r.updated)
            if isinstance(started, int | float) and not isinstance(started, bool):
                starts[_group(r)] = max(float(started), starts.get(_group(r), -math.inf))
            instance = listed.get(name)
            if r.state != "finished" and name not in over and _group(r) not in over and not (instance and instance.alive):
                down.add(_group(r))
        for group in sorted(down & set(starts)):
            self.memory = ended(self.memory, group, starts[group], now)

    def _admit(self, records: dict[str, InstanceRecord], listed: dict[str, Instance], clouds: list[str]) -> None:
        """The syncer's port (every shard's, on each cloud that runs one) follows the learners: opened to a new
        address, closed to a gone one (when the set changed)."""
        regions = {name: r.region for name, r in records.items() if r.role == "learner"}
        chosen = admission.wanted(listed, regions, admission.partitioned(self.run))
        if chosen != self.admitted:
            for kind in clouds:
                self.provider(kind).admit(self.run, chosen)
            self.admitted = chosen

    def _admit_one(self, records: dict[str, InstanceRecord]) -> None:
        """For a replacement as it comes up: list everywhere and admit (before its agent starts)."""
        chosen = admission.admit_run(self.run, records.values(), self.provider)
        if chosen is not None:
            self.admitted = chosen

    def _concluded(self, syncers: list[InstanceRecord], listed: dict[str, Instance]) -> bool:
        """The syncer (every shard) wrote its result: record it, remove the machines (unless kept); nothing is replaced
        after. A sharded job's result is its shards' joined, with the final model they hold (``control/shard_end.py``)."""
        results = []
        for r in syncers:
            spec = InstanceSpec.from_json(r.detail["spec"])
            try:
                raw = self.provider(r.provider).read_file(listed[r.name], spec.summary) if spec.summary else None
                read = parse_result(raw)
            except Exception as exc:  # noqa: BLE001 - a result of another shape: said, and the learners are still handled
                self._unsure(r, exc)
                return False
            if read is None:
                return False
            results.append(read)
        spec = InstanceSpec.from_json(syncers[0].detail["spec"])
        local = next(iter(spec.disks.values()), str(Path(spec.summary).parent))  # where the result is on this machine
        if len(results) == 1:
            [result] = results
        else:
            from ddctl.control.shard_end import sharded_result  # torch: only where a sharded job ends

            result = sharded_result(self.run, results, run_checkpoints.run_policy(self.run, self.state))
            local = result.checkpoint or local
        self._bring_tapes_home(syncers, listed)
        owners = {p.kind: p for p in searched(self.state, self.run)} | self.owners  # the ones it was given win
        summary = conclude(self.run, self.state, result, local, spare=("controller",), owners=list(owners.values()))
        log.info("the job finished (%s): val_bpb %s; result in %s", result.reason, result.val_bpb, summary["result"])
        return True

    def _bring_tapes_home(self, syncers: list[InstanceRecord], listed: dict[str, Instance]) -> None:
        """A synchronizer on a cloud VM keeps its tape on the VM's disk, which the end removes: each comes home to its
        disk's place here (where a Docker VM's is bound already), so ``ddctl replay --run`` reproduces the run after."""
        for r in syncers:
            spec = InstanceSpec.from_json(r.detail["spec"])
            home = Path(next(iter(spec.disks.values()), "")) / TAPE
            if not spec.disks or not spec.summary or home.is_file():
                continue
            try:
                raw = self.provider(r.provider).read_file(listed[r.name], f"{PurePosixPath(spec.summary).parent}/{TAPE}")
            except DdctlError as exc:
                raw, why = None, str(exc)
            else:
                why = "the VM did not answer with it"
            if raw is None:
                self.state.event(self.run, "error", instance=r.name, reason=f"its tape stays on its VM: {why}")
                continue
            home.parent.mkdir(parents=True, exist_ok=True)
            part = home.with_suffix(".part")
            part.write_bytes(raw)
            part.replace(home)  # whole or not at all: replay reads only a tape that arrived

    def _finished(self, r: InstanceRecord, instance: Instance) -> bool:
        """Its exit summary says so; where the machine kept nothing (a terminated cloud VM), the syncer's roster does."""
        spec = InstanceSpec.from_json(r.detail["spec"])
        if instance.alive or r.role != "learner" or not spec.summary:
            return False
        try:
            summary = self.provider(r.provider).read_file(instance, spec.summary)
        except TooLarge as exc:  # not a summary: the learner is replaced, as for one torn by a kill
            log.warning("%s's exit summary is taken as not finished: %s", r.name, printable(str(exc)))
            return False
        return finished(summary) if summary is not None else r.name in finished_by_syncer(self.run)

    def _unsure(self, r: InstanceRecord, exc: Exception) -> None:
        """Whether ``r`` finished could not be read: it (its whole gang) waits for the next pass, said once per reason."""
        why = printable(f"whether {r.name} finished is unknown, it waits: {type(exc).__name__}: {exc}")
        if self.said.get(r.name) != why:
            self.said[r.name] = why
            self.state.event(self.run, "error", instance=r.name, region=r.region, reason=why)
            log.error("%s", why)

    def _act(self, action: Action, r: InstanceRecord, instance: Instance | None, now: float, done: bool) -> None:
        provider = self.provider(r.provider)
        spec = InstanceSpec.from_json(r.detail["spec"])
        if action.kind == "retire" and instance is not None:
            if done:
                self.state.put_instance(replace(r, state="finished", updated=now))
            provider.retire(instance, spec.log)
        elif action.kind == "terminate" and instance is not None:  # a learner's VM that outlived one of its others
            self.state.event(self.run, "terminate", instance=r.name, region=r.region, reason=action.reason)
            provider.terminate(instance)
        elif action.kind in ("create", "replace"):
            group, node = r.detail.get("learner", ""), int(r.detail.get("node", 0))
            if node > 0 and group not in self.hosts:
                return  # its node 0 did not come up in this pass: the next pass starts the learner again as a whole
            spec = with_relay(spec, self.relay_hosts.get(r.region, ""))  # a replacement finds its region's relay now
            self._start(action, r, with_rendezvous(spec, self.hosts[group]) if node > 0 else spec, provider, now)
        elif action.kind in ("wait", "give_up") and self.said.get(r.name) != action.reason and r.state != GIVEN_UP:
            self.said[r.name] = action.reason
            self.state.event(self.run, action.kind, instance=r.name, region=r.region, reason=action.reason)
            log.warning("%s: %s", action.kind, action.reason)
            if action.kind == "give_up":  # what status shows: not rejoining, as its last replacement said
                self.state.put_instance(replace(r, state=GIVEN_UP, updated=now))

    def _start(self, action: Action, r: InstanceRecord, spec: InstanceSpec, provider: Provider, now: float) -> None:
        try:
            records = {x.name: x for x in self.state.instances(self.run) if x.role in AGENTS}
            opened = (lambda _: self._admit_one(records)) if r.role == "learner" else None
            spec, started = launch_at(provider, spec, action.placement, opened)
        except ProvisionError as error:  # a provider's refusal, classified: what failover decides on
            self.memory = remember(self.memory, replace(action, name=r.detail.get("learner") or r.name), error, now)
            self.state.event(
                self.run, "provision-failed", instance=r.name, region=r.region, error=error.kind, code=error.code,
                reason=printable(f"{action.reason}: {error}"),
            )  # fmt: skip
            log.error("%s could not start at %s: %s (%s)", r.name, action.placement, printable(str(error)), error.kind)
            return
        self.memory = remember(self.memory, action, None, now)
        if "learner" in r.detail and int(r.detail.get("node", 0)) == 0:
            self.hosts[r.detail["learner"]] = started.private_address
        if r.detail.get("relay") == "host":
            self.relay_hosts[r.region] = started.private_address
        detail = {**r.detail, "spec": spec.to_json(), "started_at": now}
        self.state.put_instance(replace(r, state="rejoining", provider_id=started.provider_id, updated=now, detail=detail))
        self.state.event(
            self.run, "replaced", instance=r.name, region=r.region, provider_id=started.provider_id, reason=action.reason
        )
        self.said.pop(r.name, None)
        log.info("%s %s: %s", action.kind, r.name, action.reason)


def finished_by_syncer(run: str) -> set[str]:
    """The learners the syncer counts as finished (its status), or none when it does not answer."""
    from ddctl.control.up import admin_client

    try:
        client = admin_client(run, timeout_s=5.0)
    except OSError:
        return set()
    try:
        names = client.status().get("finished")
    except Unavailable:
        return set()
    finally:
        client.close()
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def _left_finished(r: InstanceRecord) -> bool:
    """A learner no provider lists any more whose exit summary, on this machine, says its work is done.

    A process that ended is not listed (``ProcessProvider``), so ``_finished`` never read its summary: a learner that
    trained its share while the syncer still waited for the others was missing, and was started again. A VM that
    ended is still listed, and its summary is on the VM: not read here."""
    spec = InstanceSpec.from_json(r.detail["spec"])
    here = providers.KINDS[r.provider].local and not spec.files  # nothing was copied to a machine of its own
    if r.role != "learner" or not here or not spec.summary or not Path(spec.summary).is_file():
        return False
    return finished(Path(spec.summary).read_bytes())


def _group(r: InstanceRecord) -> str:
    """The learner ``r`` is part of (a learner over several VMs is decided on as one), or its own name."""
    return str(r.detail.get("learner") or r.name)


def _placements(r: InstanceRecord) -> tuple[Placement, ...]:
    recorded = r.detail.get("placements") or [{"provider": r.provider, "cloud_region": r.region, "zone": ""}]
    return tuple(Placement(**p) for p in recorded)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddctl.control.controller", description="Keep a run's learners alive.")
    parser.add_argument("--run", required=True)
    parser.add_argument("--state", type=Path, required=True, help="the state file")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between reconciliations")
    add_label_option(parser)
    args = parser.parse_args(argv)
    configure_logging(logging.INFO)  # every action, with its reason, goes to the controller's log
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with State(args.state) as state:
        controller = Controller(args.run, state)
        run_replanning.start(args.run, args.state, stop)  # a sharded run's re-planner, on its own thread
        run_checkpoints.start(args.run, args.state, stop)  # and its checkpoints, on another
        watch(controller, args.every, stop)
    return 0


def watch(controller: Controller, every_s: float, stop: threading.Event) -> None:
    """Reconcile every ``every_s`` until the run leaves training or ``stop`` is set; no error ends it. A provider's
    refusal or hiccup (a DdctlError: the engine restarting, a VM slow to boot) is tried again at the next pass.
    Anything else (a cloud API's or the engine's answer of a shape its checks missed, an SDK error not classified)
    is logged with its traceback once per message, recorded, and tried again after a pause that doubles up to a
    minute: the loop that replaces lost learners must outlive one bad answer."""
    state, run, failing, traced = controller.state, controller.run, 0, set[str]()

    def pause() -> float:
        return min(every_s * 2.0**failing, max(60.0, every_s))

    while not stop.wait(pause()):
        record = state.run(run)
        if record is None or record.state != "training":
            log.info("run %s is %s: the controller stops", run, record.state if record else "gone")
            return
        try:
            controller.once()
            failing = 0
        except DdctlError as exc:
            log.error("reconcile failed: %s", printable(str(exc)))
            state.event(run, "error", where="controller", message=printable(str(exc)))
        except Exception as exc:  # noqa: BLE001 - the last resort: one malformed answer must not end the loop
            failing, message = min(failing + 1, 6), printable(f"{type(exc).__name__}: {exc}")
            frames = "" if message in traced else "\n" + "".join(traceback.format_tb(exc.__traceback__)).rstrip()
            traced = traced | {message} if len(traced) < 100 else {message}
            log.error("reconcile failed unexpectedly (next try in %.0f s): %s%s", pause(), message, frames)
            state.event(run, "error", where="controller", message=message)


if __name__ == "__main__":
    sys.exit(main())

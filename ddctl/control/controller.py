"""The controller: keeps a run's observed instances equal to the desired ones.

Every second it compares the instances the run should have (the state file)
with those alive under the run's label (the provider). A syncer that died is
started again on the same port, where it recovers from its snapshot and log;
a learner that is gone without having finished its budget (preempted, killed,
crashed) gets a replacement. The replacement is a new process with the same
name, so it takes the same data shard, registers as a new incarnation,
bootstraps the current fragments from the syncer and rejoins without anyone
waiting for it. Runs as ``python -m ddctl.control.controller --run RUN`` beside the job
(``ddctl up`` starts it, ``ddctl down`` stops it first).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from ddctl import providers
from ddctl.control.state import InstanceRecord, State, run_dir
from ddctl.errors import DdctlError
from ddctl.providers.base import Instance, InstanceSpec, Provider
from ddctl_agents.entrypoint import add_label_option

AGENTS = ("syncer", "learner")


def finished(summary: bytes | None) -> bool:
    """True when the learner's exit summary says its budget was done (it must not be replaced)."""
    try:
        return summary is not None and json.loads(summary).get("reason") == "finished"
    except ValueError:
        return False


def to_replace(desired: list[InstanceRecord], alive: set[str], done: set[str]) -> list[InstanceRecord]:
    """The syncer if it is gone, and learners that should run, are not alive and did not finish."""
    out = [
        r
        for r in desired
        if r.role in AGENTS and r.name not in alive and r.state != "finished" and not (r.role == "learner" and r.name in done)
    ]
    return sorted(out, key=lambda r: r.role != "syncer")  # the syncer first: learners need it


def same_port(argv: list[str], port_file: Path) -> list[str]:
    """A restarted syncer binds the port its learners already know (it recovers from its state dir)."""
    out = list(argv)
    if "--bind" in out and port_file.exists():
        i = out.index("--bind") + 1
        out[i] = f"{out[i].rpartition(':')[0]}:{int(port_file.read_text())}"
    return out


def reconcile_once(run: str, state: State, cache: dict[str, Provider] | None = None) -> list[str]:
    """One pass: retire ended instances (collecting their logs), replace those that must run again."""
    record = state.run(run)
    if record is None or record.state != "training":
        return []
    cache = {} if cache is None else cache
    replaced = []
    for kind in sorted({r.provider for r in state.instances(run) if r.role in AGENTS}):
        provider = cache.setdefault(kind, providers.get(kind))
        desired = [r for r in state.instances(run) if r.provider == kind]
        listed = {i.name: i for i in provider.list_run(run)}
        alive = {name for name, i in listed.items() if i.alive}
        done = set()
        for r in desired:
            if r.role not in AGENTS or r.name in alive or r.state == "finished":
                continue
            spec = InstanceSpec.from_json(r.detail["spec"])
            ended = listed.get(r.name, Instance(name=r.name, provider_id="", run=run, alive=False))
            if r.role == "learner" and spec.summary and finished(provider.read_file(ended, spec.summary)):
                done.add(r.name)
                state.put_instance(_moved(r, "finished", r.provider_id))
            if ended.provider_id:
                provider.retire(ended, spec.log)
        for r in to_replace(desired, alive, done):
            spec = InstanceSpec.from_json(r.detail["spec"])
            if r.role == "syncer" and kind == "process":
                spec = replace(spec, argv=tuple(same_port(list(spec.argv), run_dir(run) / "syncer.port")))
            started = provider.create(spec)
            state.put_instance(_moved(r, "rejoining", started.provider_id))
            state.event(run, "replaced", instance=r.name, region=r.region, provider_id=started.provider_id)
            replaced.append(r.name)
    return replaced


def _moved(r: InstanceRecord, status: str, provider_id: str) -> InstanceRecord:
    return replace(r, state=status, provider_id=provider_id, updated=time.time())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddctl.control.controller", description="Keep a run's learners alive.")
    parser.add_argument("--run", required=True)
    parser.add_argument("--state", type=Path, required=True, help="the state file")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between reconciliations")
    add_label_option(parser)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cache: dict[str, Provider] = {}
    with State(args.state) as state:
        while not stop.wait(args.every):
            record = state.run(args.run)
            if record is None or record.state not in ("training",):
                break
            try:
                replaced = reconcile_once(args.run, state, cache)
            except DdctlError as exc:  # a provider hiccup (the engine restarting, a VM slow to boot): try again
                print(f"{time.strftime('%H:%M:%S')} reconcile failed: {exc}", flush=True)
                state.event(args.run, "error", where="controller", message=str(exc))
                continue
            for name in replaced:
                print(f"{time.strftime('%H:%M:%S')} replaced {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

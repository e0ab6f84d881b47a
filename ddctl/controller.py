"""The controller: keeps a run's observed instances equal to the desired ones.

Every second it compares the instances the run should have (the state file)
with those alive under the run's label (the provider). A syncer that died is
started again on the same port, where it recovers from its snapshot and log;
a learner that is gone without having finished its budget (preempted, killed,
crashed) gets a replacement. The replacement is a new process with the same
name, so it takes the same data shard, registers as a new incarnation,
bootstraps the current fragments from the syncer and rejoins without anyone
waiting for it. Runs as ``python -m ddctl.controller --run RUN`` beside the job
(``ddctl up`` starts it, ``ddctl down`` stops it first).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

from ddctl.providers.base import InstanceSpec
from ddctl.providers.process import ProcessProvider
from ddctl.state import InstanceRecord, State
from ddctl_agents.entrypoint import add_label_option


def finished(summary: Path) -> bool:
    """True when the learner ended because its budget was done (it must not be replaced)."""
    try:
        return bool(json.loads(summary.read_text()).get("reason") == "finished")
    except (OSError, ValueError):
        return False


def to_replace(desired: list[InstanceRecord], alive: set[str]) -> list[InstanceRecord]:
    """The syncer if it is gone, and learners that should run, are not alive and did not finish."""
    out = []
    for record in desired:
        if record.name in alive or record.role not in ("syncer", "learner"):
            continue
        summary = record.detail.get("summary")
        if record.role == "syncer" or not (summary and finished(Path(summary))):
            out.append(record)
    return sorted(out, key=lambda r: r.role != "syncer")  # the syncer first: learners need it


def same_port(argv: list[str], port_file: Path) -> list[str]:
    """A restarted syncer binds the port its learners already know (it recovers from its state dir)."""
    out = list(argv)
    if "--bind" in out and port_file.exists():
        i = out.index("--bind") + 1
        out[i] = f"{out[i].rpartition(':')[0]}:{int(port_file.read_text())}"
    return out


def reconcile_once(run: str, state: State, provider: ProcessProvider) -> list[str]:
    record = state.run(run)
    if record is None or record.state != "training":
        return []
    alive = {i.name for i in provider.list_run(run)}
    replaced = []
    for inst in to_replace(state.instances(run), alive):
        argv = inst.detail["argv"]
        if inst.role == "syncer":
            argv = same_port(argv, Path(inst.detail["port_file"]))
        spec = InstanceSpec(
            run=run,
            name=inst.name,
            region=inst.region,
            role=inst.role,
            argv=tuple(argv),
            log=Path(inst.detail["log"]),
        )
        started = provider.create(spec)
        state.put_instance(
            InstanceRecord(
                run, inst.name, inst.region, inst.provider, inst.role, "rejoining", started.provider_id, time.time(), inst.detail
            )
        )
        state.event(run, "replaced", instance=inst.name, region=inst.region, pid=started.provider_id)
        replaced.append(inst.name)
    return replaced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddctl.controller", description="Keep a run's learners alive.")
    parser.add_argument("--run", required=True)
    parser.add_argument("--state", type=Path, required=True, help="the state file")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between reconciliations")
    add_label_option(parser)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    provider = ProcessProvider()
    with State(args.state) as state:
        while not stop.wait(args.every):
            record = state.run(args.run)
            if record is None or record.state not in ("training",):
                break
            for name in reconcile_once(args.run, state, provider):
                print(f"{time.strftime('%H:%M:%S')} replaced {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

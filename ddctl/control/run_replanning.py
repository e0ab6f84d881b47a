"""The re-planner of a sharded run ``up`` started: beside the controller, on its own thread, with the run's records.

``control/replanning.py`` decides and moves fragments; this runs it for a run:
the shards' addresses and sites from the run's directory and plan, the priors
and re-plan settings from its regions file, one look every ``REPLAN_EVERY_S``.
Its own thread, because a look waits on the shards (up to half a minute for
one that is down and being replaced) and the controller's reconcile must not.
Each look is recorded with the run (``replanner``: the busiest site's predicted
utilisation against the best placement's, the streak, the re-plans so far), and
each re-plan is an event with its cause, its moves and each handoff's time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddctl.control.credentials import token_for
from ddctl.control.replanning import Replanning, for_job, watch
from ddctl.control.rundir import RunDir
from ddctl.control.state import State
from ddctl.errors import DdctlError
from ddctl_agents.agent.client import SyncerClient

log = logging.getLogger(__name__)
REPLAN_EVERY_S = 10.0


@dataclass(slots=True)
class RunReplanner:
    """One sharded run's re-planner and where it records what it saw."""

    run: str
    state: State
    replanning: Replanning
    replans: int = 0

    @classmethod
    def for_run(cls, run: str, state: State) -> RunReplanner | None:
        """The run's re-planner; None for a run with one synchronizer (nothing to move between)."""
        from ddctl.config.regions import job_config, load_regions
        from ddctl.control.plan import syncer_shards

        rundir, record = RunDir(run), state.run(run)
        if record is None or not rundir.shard_urls.is_file():
            return None
        rf = load_regions(Path(record.regions_file))
        token, ca = token_for(rundir.job, "admin"), rundir.ca
        sites = {s.shard: s.region for s in syncer_shards(rf)}
        connect = lambda url: SyncerClient(url, token, ca, timeout_s=10.0)  # noqa: E731
        return cls(run, state, for_job(rf, job_config(rf), rundir.urls(), connect, sites))

    def record(self, event: dict[str, Any]) -> None:
        """A look, as the run's ``replanner`` figures; a re-plan, as an event with its cause and moves."""
        made = event.get("replan")
        self.replans += made is not None
        seen = {k: event.get(k) for k in ("utilisation", "best", "streak", "floor", "skipped")}
        self.state.update_run_detail(
            self.run, {"replanner": {"t": time.time(), **seen, "replans": self.replans, "error": event.get("error")}}
        )
        if "error" in event:
            log.warning("re-planner look failed (the next one tries again): %s", event["error"])
        if made is not None:
            moves = ", ".join(f"f{m['fragment']} {m['from']}->{m['to']} ({m['shard']}, {m.get('seconds', '-')}s"
                              + (f"; failed: {m['error']}" if "error" in m else "") + ")" for m in made["moves"])  # fmt: skip
            self.state.event(self.run, "replan", cause=made["cause"], before=made["before"], after=made["after"], moves=moves)
            log.info("re-plan: %s: %s", moves, made["cause"])


def start(run: str, state_path: Path, stop: threading.Event, every_s: float = REPLAN_EVERY_S) -> threading.Thread | None:
    """The run's re-planner on its own thread (with its own handle on the state file) until ``stop``; None if the run
    has one synchronizer or its re-planner cannot be made (said in the log and the run's events)."""

    def loop() -> None:
        with State(state_path) as state:
            try:
                replanner = RunReplanner.for_run(run, state)
            except DdctlError as exc:
                log.error("no re-planner for run %s: %s", run, exc)
                state.event(run, "error", where="re-planner", message=str(exc))
                return
            if replanner is not None:
                watch(replanner.replanning, every_s, until=stop.is_set, on_event=replanner.record)

    if not RunDir(run).shard_urls.is_file():
        return None
    thread = threading.Thread(target=loop, name="replanner", daemon=True)
    thread.start()
    return thread

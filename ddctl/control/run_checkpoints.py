"""A sharded run's checkpoints on the schedule of its ``checkpoints:`` section, taken by the controller.

One synchronizer checkpoints its whole model itself. A shard holds only its
fragments, so the controller, beside the job on its own thread, takes a global
checkpoint of every shard at one consistent cut (``control/global_checkpoint.py``)
every ``every_rounds`` rounds the job merged (the shards' rounds added up) or
``every_minutes``, and only when rounds were merged since the last, like the
synchronizer's own schedule (``service/checkpoints.py``, whose ``store`` keeps
them the same way: ``RUN/checkpoints/ckpt-<n>``, an index, the newest
``keep_last`` and every ``keep_every``-th, and a copy under ``url/RUN``).
``ddctl pull --run`` reads them and ``up --resume-from`` starts from them. Each
one is an event of the run, and the run's ``checkpoints`` detail says how many,
the last one's name, rounds and val_bpb, and the last error, if any.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddctl.config.regions import Checkpoints, load_regions
from ddctl.control.credentials import token_for
from ddctl.control.rundir import RunDir
from ddctl.control.shard_status import gather
from ddctl.control.state import State
from ddctl.errors import DdctlError, RegionsError
from ddctl_agents import storage
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.errors import AgentError

if TYPE_CHECKING:  # torch, imported only where a sharded run checkpoints
    from ddctl_agents.service.checkpoints import CheckpointPolicy

log = logging.getLogger(__name__)
STORING = threading.Lock()
"""One checkpoint stored at a time in this process: the schedule's thread and the job's end both number the next one."""
LOOK_EVERY_S = 10.0
"""How often the controller asks the shards how many rounds they merged (a checkpoint is due at most this late)."""


def policy_for(checkpoints: Checkpoints, run: str) -> CheckpointPolicy:
    """The ``checkpoints:`` section as the schedule the synchronizer follows, its copies under ``url/RUN``."""
    from ddctl_agents.service.checkpoints import CheckpointPolicy

    return CheckpointPolicy(every_rounds=checkpoints.every_rounds, every_s=checkpoints.every_minutes * 60,
                            keep_last=checkpoints.keep_last, keep_every=checkpoints.keep_every,
                            url=storage.join(checkpoints.url, run) if checkpoints.url else "")  # fmt: skip


def run_policy(run: str, state: State) -> CheckpointPolicy:
    """The schedule of the run's regions file; the defaults', said in the log, where it cannot be read any more (moved
    or edited since ``up``): a job's end is recorded whatever became of its file."""
    record = state.run(run)
    try:
        checkpoints = load_regions(Path(record.regions_file)).checkpoints if record else Checkpoints()
    except (RegionsError, OSError) as exc:
        log.warning("run %s: its regions file cannot be read (%s); its checkpoints follow the defaults", run, exc)
        checkpoints = Checkpoints()
    return policy_for(checkpoints, run)


def job_rounds(statuses: Sequence[tuple[str, dict[str, Any] | None, str]]) -> int:
    """The rounds the job merged: every shard's added up. DdctlError when a shard did not answer or its ``rounds`` is
    not a count (a shard's answer is checked, not trusted)."""
    total = 0
    for url, status, why in statuses:
        if status is None:
            raise DdctlError(f"shard {url} did not answer: {why}")
        rounds = status.get("rounds")
        if type(rounds) is not int or rounds < 0:
            raise DdctlError(f"shard {url} answered rounds={str(rounds)[:40]!r}; a count (an integer >= 0) was expected")
        total += rounds
    return total


def ending(statuses: Sequence[tuple[str, dict[str, Any] | None, str]]) -> bool:
    """Whether a shard has begun to finish the job: from then on the job's end takes the final model, not the schedule."""
    for _, status, _ in statuses:
        job = status.get("job") if status is not None else None
        if isinstance(job, dict) and job.get("phase") not in (None, "training"):
            return True
    return False


@dataclass(slots=True)
class RunCheckpoints:
    """One sharded run's checkpoint schedule, what it has taken, and where it records that."""

    run: str
    state: State
    policy: CheckpointPolicy
    urls: list[str]
    connect: Callable[[str], SyncerClient]
    assembly: Any
    root: Path
    last_rounds: int = 0
    last_at: float = field(default_factory=time.monotonic)
    taken: int = 0
    last: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def for_run(cls, run: str, state: State) -> RunCheckpoints | None:
        """The run's schedule; None for a run with one synchronizer (it checkpoints itself) or without a schedule."""
        from ddctl.control.global_checkpoint import job_assembly

        rundir = RunDir(run)
        if state.run(run) is None or not rundir.shard_urls.is_file():
            return None
        policy = run_policy(run, state)
        if not (policy.every_rounds or policy.every_s):
            return None
        token, ca = token_for(rundir.job, "admin"), rundir.ca
        connect = lambda url: SyncerClient(url, token, ca, timeout_s=60.0)  # noqa: E731
        return cls(run, state, policy, rundir.urls(), connect, job_assembly(rundir.job), rundir.global_checkpoints)

    def look(self, now: float) -> dict[str, Any] | None:
        """Take a checkpoint if one is due (what it was), else None; a failure is recorded and tried again next look.
        Once the job's end has taken its final model the schedule is over: its shards leave, and a shard that no
        longer answers then is no error (CI saw one recorded as the run's last checkpoint error)."""
        from ddctl_agents.service.checkpoints import due

        if self._final_taken():
            return None
        try:
            statuses = gather(self.urls, self.connect, check=None)  # job_rounds and ending check what they read
            if ending(statuses):  # a shard finishing: the end takes the final model, whether the others answer or not
                return None
            if not due(self.policy, job_rounds(statuses), self.last_rounds, now, self.last_at):
                return None
            return self.take(now)
        except (DdctlError, AgentError, OSError) as exc:
            log.warning("sharded checkpoint not taken (the next look tries again): %s", exc)
            error = str(exc)[:500]
            if error != self.error:  # an event when it starts failing (or fails anew), not one per look
                self.state.event(self.run, "error", where="checkpoints", message=error)
            self.error = error
            self._record(error=error)
            return None

    def take(self, now: float) -> dict[str, Any] | None:
        """A global checkpoint now, stored with the run's others; recorded as the run's figures and an event. None when
        the job's end took its final model meanwhile: that one is the newest, and this one would only repeat it."""
        from ddctl.control.global_checkpoint import take_files
        from ddctl_agents.service.checkpoints import store

        started = time.perf_counter()
        shapes = {name: tuple(t.shape) for name, t in self.assembly.initial.items()}
        files, cut = take_files(self.urls, self.connect, self.assembly.evaluate, shapes)
        with STORING:
            if self._final_taken():
                return None
            stored = store(self.root, files, self.policy)
        self.taken, self.last_rounds, self.last_at = self.taken + 1, int(cut["rounds"]), now
        self.last = {"name": stored["name"], "cut": cut["cut"], "rounds": cut["rounds"], "val_bpb": cut["val_bpb"],
                     "bytes": stored["bytes"], "seconds": round(time.perf_counter() - started, 2)}  # fmt: skip
        self.error = None
        self._record(error=None, uploaded=stored["uploaded"])
        self.state.event(self.run, "checkpoint", **self.last)
        log.info("sharded checkpoint %s: cut %s, %s rounds", stored["name"], cut["cut"], cut["rounds"])
        return {**self.last, "uploaded": stored["uploaded"]}

    def _final_taken(self) -> bool:
        """Whether the job's end has taken its final model (``control/shard_end.py``): the schedule is over then."""
        from ddctl_agents.train.checkpoint import MANIFEST

        return (RunDir(self.run).final / MANIFEST).is_file()

    def _record(self, **extra: Any) -> None:
        """The run's ``checkpoints`` figures: how many were taken, the last one, the last error (None after a success)."""
        figures = {"t": time.time(), "taken": self.taken, **self.last, **extra}
        self.state.update_run_detail(self.run, {"checkpoints": figures})


def start(run: str, state_path: Path, stop: threading.Event, every_s: float = LOOK_EVERY_S) -> threading.Thread | None:
    """The run's checkpoint schedule on its own thread (its own handle on the state file) until ``stop``; None for a
    run with one synchronizer. A schedule that cannot be made is said in the log and the run's events."""

    def loop() -> None:
        with State(state_path) as state:
            try:
                schedule = RunCheckpoints.for_run(run, state)
            except (DdctlError, AgentError, OSError) as exc:
                log.error("no checkpoint schedule for run %s: %s", run, exc)
                state.event(run, "error", where="checkpoints", message=str(exc))
                return
            while schedule is not None and not stop.wait(every_s):
                schedule.look(time.monotonic())

    if not RunDir(run).shard_urls.is_file():
        return None
    thread = threading.Thread(target=loop, name="checkpoints", daemon=True)
    thread.start()
    return thread

"""A sharded run's end: its shards' results as the job's one, and its final model joined from their parts.

Each shard ends on its own and writes its own summary: its books count its own
fragments, and it holds part of the model, so it can neither evaluate nor
checkpoint the model alone (``ddctl_agents.service.ending``). Once every
shard has ended, the controller takes one global checkpoint of the finished
shards (``control/global_checkpoint.py``) into the run's ``final`` directory
(and as the newest of the run's checkpoints, ``control/run_checkpoints.py``),
evaluates it, and records the job's result: the books added up, what learners
report taken once (the largest any shard heard), the model's val_bpb and where
the model is. Taken once: a controller that restarts after the checkpoint was
written reads it back instead of cutting again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ddctl.control.credentials import token_for
from ddctl.control.finish import RunResult, TokenBooks
from ddctl.control.global_checkpoint import job_assembly, take_files
from ddctl.control.run_checkpoints import STORING
from ddctl.control.rundir import RunDir
from ddctl.control.shard_status import job_figure
from ddctl.errors import DdctlError
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.errors import AgentError
from ddctl_agents.service.checkpoints import CheckpointPolicy, store
from ddctl_agents.train.checkpoint import MANIFEST, read_manifest, write_directory


def joined(results: Sequence[RunResult], val_bpb: float | None, checkpoint: str) -> RunResult:
    """The job's result from its shards' (in shard order) and its joined final model's val_bpb (pure)."""
    first = results[0]
    books: dict[str, int] = {}
    for result in results:
        tokens = result.tokens.model_dump()
        books = {key: job_figure(key, books.get(key, 0), value) for key, value in tokens.items()}
    return RunResult(
        run=first.run,
        reason=first.reason,
        finished_at=max(r.finished_at for r in results),
        uptime_s=max(r.uptime_s for r in results),
        quorum_s=max(r.quorum_s for r in results),
        goodput=min((r.goodput for r in results if r.goodput is not None), default=None),
        rounds=sum(r.rounds for r in results),
        tokens=TokenBooks(**books),
        val_bpb=val_bpb,
        bytes_up=sum(r.bytes_up for r in results),
        bytes_down=sum(r.bytes_down for r in results),
        learners_finished=sorted({name for r in results for name in r.learners_finished}),
        state_dir=first.state_dir,
        checkpoint=checkpoint,
    )


def final_model(run: str, policy: CheckpointPolicy | None = None) -> dict[str, Any]:
    """The finished shards' global checkpoint in the run's ``final`` directory (taken once), with its val_bpb; with a
    ``policy``, also the newest of the run's checkpoints (``RUN/checkpoints``, and under its ``url``), as a
    synchronizer's last checkpoint is its final model."""
    rundir = RunDir(run)
    if (rundir.final / MANIFEST).is_file():  # taken by an earlier pass of the controller
        manifest = read_manifest((rundir.final / MANIFEST).read_bytes())
        return {"path": str(rundir.final), "val_bpb": manifest.val_bpb}
    token, ca = token_for(rundir.job, "admin"), rundir.ca
    try:
        assembly = job_assembly(rundir.job)
        files, cut = take_files(
            rundir.urls(),
            lambda url: SyncerClient(url, token, ca, timeout_s=60.0),
            evaluate=assembly.evaluate,
            shapes={name: tuple(t.shape) for name, t in assembly.initial.items()},
        )
    except AgentError as exc:  # a shard's refusal or a part that does not check: the controller tries again
        raise DdctlError(f"run {run}: the shards' final model could not be joined: {exc}") from None
    with STORING:  # the schedule's thread stores none after this one (``run_checkpoints.RunCheckpoints.take``)
        if policy is not None:
            store(rundir.global_checkpoints, files, policy)
        write_directory(rundir.final, files)  # last: what says the end's checkpoint was taken
    return {"path": str(rundir.final), "val_bpb": cut["val_bpb"]}


def sharded_result(run: str, results: Sequence[RunResult], policy: CheckpointPolicy | None = None) -> RunResult:
    """Every shard's result (in shard order) and the run's final model as the job's result."""
    model = final_model(run, policy)
    val_bpb = model["val_bpb"]
    return joined(results, round(val_bpb, 5) if val_bpb is not None else None, model["path"])

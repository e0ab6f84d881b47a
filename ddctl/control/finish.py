"""A run's end from the laptop: the syncer's result read and checked, recorded, the machines removed.

The synchronizer decides when the job is over (``ddctl_agents.service.ending``)
and writes ``summary.json`` on its disk. The controller reads it
(``result_of``), checks it like any answer from another process, records it
with the run and what the run cost (``conclude``), and removes every machine
unless the run was started with ``up --keep``. ``ddctl stop`` asks the syncer
to end the job now and waits for the same result.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ddctl.control.down import down
from ddctl.control.rundir import RunDir
from ddctl.control.runs import dollars_so_far
from ddctl.control.state import State
from ddctl.errors import DdctlError, UnreachableError
from ddctl.providers.base import Provider
from ddctl_agents.core.text import printable
from ddctl_agents.errors import Unavailable
from ddctl_agents.service.requests import Identity
from ddctl_agents.waiting import wait_until

Count = Annotated[int, Field(ge=0, le=2**62)]
Seconds = Annotated[float, Field(ge=0, le=1e9)]
Epoch = Annotated[float, Field(ge=0, le=1e11)]
"""A Unix time (seconds since 1970): beyond year 5000 is not a time, it is a bug or an attack."""


def _shown(most: int) -> AfterValidator:
    """A string of at most ``most`` characters with its control characters escaped: it goes to the log, the events
    and ``ddctl stop``'s output, where a newline would forge a line and ESC drive the terminal; escaped, not refused,
    so the run still concludes."""
    return AfterValidator(lambda text: printable(text, most))


Text = Annotated[str, Field(max_length=200), _shown(200)]
Where = Annotated[str, Field(max_length=4096), _shown(4096)]


class TokenBooks(BaseModel):
    """Every figure in tokens; each means one thing (``ddctl_agents.service.ending.tokens``)."""

    model_config = ConfigDict(extra="ignore")
    budget: Count
    planned: Count
    trained: Count
    received: Count
    merged: Count
    late_merged: Count
    dropped: Count
    rejected: Count
    pending: Count


class RunResult(BaseModel):
    """The syncer's summary as the laptop accepts it: bounded, typed, nothing else."""

    model_config = ConfigDict(extra="ignore")
    run: Text
    reason: Text
    finished_at: Epoch
    uptime_s: Seconds
    quorum_s: Seconds
    goodput: Annotated[float, Field(ge=0, le=1)] | None
    rounds: Count
    tokens: TokenBooks
    val_bpb: Annotated[float, Field(ge=0, le=1e3)] | None
    bytes_up: Count
    bytes_down: Count
    learners_finished: Annotated[list[Identity], Field(max_length=4096)]
    state_dir: Where
    checkpoint: Where | None = ""
    """The final checkpoint, as the syncer's machine names it (``ddctl pull`` fetches it); None from a shard of a
    sharded synchronizer, which holds part of the model (the controller joins the shards' into the run's)."""


def parse_result(raw: bytes | None) -> RunResult | None:
    """The syncer's summary file, checked; None if there is none yet. A malformed one is an error, not a result."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past the stack
        raise DdctlError(f"the syncer's summary.json is not JSON: {printable(str(exc))}") from None
    if isinstance(data, dict) and isinstance(data.get("val_bpb"), float) and not math.isfinite(data["val_bpb"]):
        data["val_bpb"] = None
    try:
        return RunResult.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise DdctlError(f"the syncer's summary.json is malformed at {where or 'top level'}: {first['msg']}") from None


def conclude(
    run: str,
    state: State,
    result: RunResult,
    local_result: str,
    spare: tuple[str, ...] = (),
    owners: list[Provider] | None = None,
) -> dict[str, Any]:
    """Record the result and the cost, say ``finished``, and remove every machine unless the run keeps them."""
    record = state.run(run)
    if record is None:
        raise DdctlError(f"no run named {run!r}")
    now = time.time()
    state.update_run_detail(run, {"ended_at": now})
    cost = dollars_so_far(state.run(run) or record, now)
    summary = {**result.model_dump(), "result": local_result, "dollars": cost}
    state.update_run_detail(run, {"summary": summary})
    state.event(run, "finished", reason=result.reason, val_bpb=result.val_bpb, result=local_result)
    done = set(result.learners_finished)
    for instance in state.instances(run):  # a learner still exiting (torchrun takes seconds) did finish its share
        if instance.role == "learner" and instance.name in done and instance.state != "finished":
            state.put_instance(replace(instance, state="finished", updated=now))
    keep = bool(record.detail.get("keep"))
    if not keep:
        down(run, state, spare=spare, owners=owners)
    state.set_run_state(run, "kept" if keep else "finished")
    return summary


StopAsk = Callable[[str, str, str], bool]
"""(run, url, reason) -> whether that syncer began ending the job now (False: it already was); Unavailable if unreached."""


def stop(run: str, state: State, reason: str, timeout_s: float = 600.0, ask: StopAsk | None = None) -> dict[str, Any]:
    """Ask the syncer (every shard) to end the job now, then wait until the controller recorded the result.

    A shard that does not answer (restarting, a network blip) is asked again while we wait, so
    the others are not left running on its account; past ``timeout_s`` the error names every
    shard that never answered, or says the job is still finishing."""
    ask = ask or ask_to_stop
    unasked = list(RunDir(run).urls())
    stopping = False

    def ended() -> dict[str, Any] | None:
        nonlocal stopping
        for url in list(unasked):  # every shard of a sharded synchronizer ends its fragments' part of the job
            try:
                stopping |= ask(run, url, reason)
            except Unavailable:
                continue
            unasked.remove(url)
        record = state.run(run)
        return record.detail.get("summary") if record is not None and record.state in ("finished", "kept") else None

    def late(message: str) -> DdctlError:
        if unasked:
            return UnreachableError(f"{message}: the synchronizer at {', '.join(unasked)} never answered the stop")
        return DdctlError(f"{message}; every synchronizer was asked to stop, `ddctl status --run {run}` shows where it is")

    summary = wait_until(ended, timeout_s=timeout_s, every_s=0.5, what=f"{run} to finish", error=late)
    return {"run": run, "stopping": stopping, "summary": summary}


def ask_to_stop(run: str, url: str, reason: str) -> bool:
    """Ask one synchronizer process to end the job now: whether it began to (False: it already was ending)."""
    from ddctl.control.up import admin_client

    client = admin_client(run, url=url)
    try:
        answer = client.stop_job(reason)
    finally:
        client.close()
    return isinstance(answer, dict) and answer.get("stopping") is True  # checked: another process's answer

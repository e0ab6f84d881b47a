"""Run one learner against a syncer: ``python -m ddctl_agents.agent --syncer URL --name L0 ...``.

The learner fetches the job from the syncer, registers (a fresh incarnation per
process, so its update ids never collide with a previous life's), bootstraps
every fragment from the subscription stream, then trains. Between steps it
adopts arrived fragments and queues due outer gradients; the network threads
do the rest. SIGTERM (or the step budget) ends training: pending drift is
pushed and acknowledged before the learner says goodbye.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddctl_agents.agent.client import Refused, SyncerClient, Unavailable, retry
from ddctl_agents.agent.comm import JOB_OVER, Comms, Identity
from ddctl_agents.agent.notice import Stop, watch
from ddctl_agents.agent.progress import Progress
from ddctl_agents.core.ending import FINISHED, STOPPED
from ddctl_agents.entrypoint import EXIT_OK, EXIT_UNREACHABLE, Parser, add_label_option, configure_logging, report
from ddctl_agents.errors import AgentError
from ddctl_agents.jsonable import from_json
from ddctl_agents.train.assembly import Assembly, learner_index
from ddctl_agents.train.job import JobConfig

log = logging.getLogger(__name__)
REPORT_EVERY = 10
"""Read the loss (a host sync on accelerators) once every this many steps."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnerOptions:
    syncer: str
    name: str
    token: str
    ca: Path | None = None
    region: str = ""
    summary: Path | None = None
    max_steps: int = 0
    """Stop after this many steps of this process (0: the job's budget)."""
    drain_timeout_s: float = 60.0
    syncer_timeout_s: float = 0.0
    """Dead-man switch: end if the syncer is unreachable this long (0: never)."""
    parallel_uploads: int = 3
    """Uploads in flight at once (each on its own connection)."""


def run_learner(opts: LearnerOptions, stop: threading.Event | None = None) -> dict[str, Any]:
    """Train until the budget, ``stop`` or SIGTERM; returns the summary (also written to opts.summary)."""
    stop = stop or threading.Event()
    index = learner_index(opts.name)
    born = time.time()

    def connect() -> SyncerClient:
        return SyncerClient(opts.syncer, opts.token, opts.ca)

    client = connect()
    try:
        job_answer = retry(client.job, give_up_after_s=120.0)
    finally:
        client.close()
    job = from_json(JobConfig, job_answer["job"])
    assembly = Assembly.build(job)
    me = Identity(name=opts.name, incarnation=time.time_ns() // 1000, region=opts.region)
    comms = Comms(connect, me, job.sync.codec, job.sync.block, parallel_uploads=opts.parallel_uploads)
    answer = comms.start(assembly.fragmentation.count)
    learner = assembly.new_learner(index, me.incarnation, start_step=int(answer["start_step"]))
    started_at, start_step = time.monotonic(), learner.step
    while not learner.ready and not stop.is_set():  # bootstrap: every fragment's current version
        for message in comms.arrivals():
            learner.adopt(message)
        time.sleep(0.01)
    bootstrap_s = time.monotonic() - started_at
    budget = learner.total_steps if opts.max_steps <= 0 else min(learner.total_steps, learner.step + opts.max_steps)
    progress = Progress(total=budget)
    step_times: deque[float] = deque(maxlen=16)
    last_adopt, loss_value, reason = learner.step, None, FINISHED
    tick = time.perf_counter()
    train_seconds = 0.0
    while learner.step < budget:
        if stop.is_set():
            reason = stop.reason if isinstance(stop, Stop) else "sigterm"
            break
        if opts.syncer_timeout_s and time.monotonic() - comms.last_contact > opts.syncer_timeout_s:
            reason = "syncer_gone"
            break
        if comms.stop_asked.is_set():
            reason = STOPPED
            break
        for message in comms.arrivals():
            pending = learner.on_arrival(message)
            if pending is not None:
                comms.send(pending)
            last_adopt = learner.step
        loss = learner.train_step()
        for p in learner.due():
            if learner.has_drift(p):
                comms.send(learner.make_update(p))
        now = time.perf_counter()
        step_times.append(now - tick)
        train_seconds += now - tick
        tick = now
        if learner.step % REPORT_EVERY == 0:
            loss_value = float(loss)
        step_time = statistics.median(step_times)
        comms.set_report(
            step=learner.step,
            step_time=step_time,
            tokens=learner.ledger.trained // max(len(learner.state), 1),
            tokens_per_s=learner.tokens_per_step / step_time if step_time > 0 else 0.0,
            loss=loss_value,
            staleness=learner.step - last_adopt,
            due=list(learner.due_steps()),
        )
        progress.report(time.monotonic(), learner, comms)
    if reason != "syncer_gone":
        for p in range(len(learner.state)):
            if learner.has_drift(p) and learner.state[p].version >= 0:
                comms.send(learner.make_update(p))
    drained = comms.drain(opts.drain_timeout_s) if reason != "syncer_gone" else False
    progress.finish(time.monotonic(), learner, comms, reason)
    trained = learner.ledger.trained // max(len(learner.state), 1)
    comms.close(reason=reason if reason != "syncer_gone" else None, tokens=trained)
    summary = {
        "learner": opts.name,
        "incarnation": me.incarnation,
        "reason": reason,
        "rebalance_recommended": bool(getattr(stop, "rebalance_recommended", False)),
        "start_step": start_step,
        "step": learner.step,
        "bootstrap_s": round(bootstrap_s, 3),
        "drained": drained,
        "loss": loss_value,
        "trained_tokens": learner.ledger.trained,
        "overwritten_tokens": learner.ledger.overwritten,
        "sent_tokens": comms.ledger.sent,
        "acked_tokens": dict(comms.ledger.acked),
        "rejected_tokens": comms.ledger.rejected,
        "unsent_tokens": learner.unsent(),
        "bytes_up": comms.ledger.bytes_up,
        "bytes_down": comms.ledger.bytes_down,
        "train_seconds": round(train_seconds, 3),
        "started_at": round(born, 3),
        "ended_at": round(time.time(), 3),
    }
    if opts.summary is not None:
        opts.summary.parent.mkdir(parents=True, exist_ok=True)
        tmp = opts.summary.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, opts.summary)
        with opts.summary.with_suffix(".history.jsonl").open("a") as history:  # one line per incarnation
            history.write(json.dumps(summary) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    defaults = LearnerOptions(syncer="", name="", token="")
    parser = Parser("ddctl learner run", "Run one Decoupled DiLoCo learner against a syncer.")
    parser.add_argument("--syncer", required=True, help="The syncer's URL: https://HOST:PORT (http:// for h2c on loopback).")
    parser.add_argument("--name", required=True, help="This learner's name, L0 .. L{M-1}; it picks the data shard.")
    parser.add_argument("--token", help="This learner's token (or DDCTL_TOKEN, or --token-file).")
    parser.add_argument("--token-file", type=Path, help="A file holding this learner's token.")
    parser.add_argument("--ca", type=Path, help="The job's CA certificate to pin (https only).")
    parser.add_argument("--region", default=defaults.region, help="The region's name, for per-region link figures.")
    parser.add_argument("--summary", type=Path, help="Write a JSON summary here at exit.")
    parser.add_argument("--max-steps", type=int, default=defaults.max_steps, help="Stop after this many steps (0: the budget).")
    parser.add_argument(
        "--syncer-timeout",
        type=float,
        default=defaults.syncer_timeout_s,
        help="End if the syncer is unreachable this many seconds (0: never).",
    )
    parser.add_argument("--notice-url", help="An instance-metadata URL to poll for a spot interruption notice.")
    add_label_option(parser)
    parser.add_argument("--parallel-uploads", type=int, default=defaults.parallel_uploads, help="Uploads in flight at once.")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        token = args.token or os.environ.get("DDCTL_TOKEN") or (args.token_file.read_text().strip() if args.token_file else "")
        if not token:
            raise AgentError("give the learner's token with --token, --token-file or DDCTL_TOKEN")
        opts = LearnerOptions(
            syncer=args.syncer,
            name=args.name,
            token=token,
            ca=args.ca,
            region=args.region,
            summary=args.summary,
            max_steps=args.max_steps,
            syncer_timeout_s=args.syncer_timeout,
            parallel_uploads=args.parallel_uploads,
        )
        if opts.parallel_uploads < 1:
            raise AgentError(f"--parallel-uploads must be >= 1, got {opts.parallel_uploads}")
        stop = Stop()
        signal.signal(signal.SIGTERM, lambda *_: stop.trigger("sigterm"))
        if args.notice_url:
            watch(args.notice_url, stop)
        summary = run_learner(opts, stop)
    except Refused as exc:
        if exc.code == JOB_OVER:  # nothing left to train: a learner started after the end has nothing to do
            print(f"the job is over: {exc.reason}", file=sys.stderr)
            return 0
        return report(parser.prog, exc, "the syncer refused")
    except (AgentError, OSError) as exc:  # exit codes as ddctl's: 6 for an unreachable syncer, 2 for the rest
        return report(parser.prog, exc, "syncer unreachable" if isinstance(exc, Unavailable) else "")
    print(json.dumps(summary), flush=True)
    return EXIT_UNREACHABLE if summary["reason"] == "syncer_gone" else EXIT_OK  # the dead-man switch ends as unreachable

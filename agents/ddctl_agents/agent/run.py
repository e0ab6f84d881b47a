"""Run one learner against a syncer: ``python -m ddctl_agents.agent --syncer URL --name L0 ...``.

The learner fetches the job from the syncer (with the source of a model of
your own, unpacked to a local folder: ``train/modelfiles.py``), registers (a fresh incarnation per
process, so its update ids never collide with a previous life's), bootstraps
every fragment from the subscription stream, then trains. Between steps it
adopts arrived fragments and queues due outer gradients; the network threads
do the rest. SIGTERM (or the step budget) ends training: pending drift is
pushed and acknowledged before the learner says goodbye.

With ``--gpus N`` (or ``--nodes K``) the learner is N ranks under torchrun
(``agent/launch.py``): every rank runs this, rank 0 alone talks to the syncer,
and the step loop (``agent/loop.py``) keeps them in lockstep.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddctl_agents.agent import relay_host
from ddctl_agents.agent.again import STARTED_OVER, exit_code, rerun_codes, rerun_summaries
from ddctl_agents.agent.client import Refused, SyncerClient, Unavailable, retry
from ddctl_agents.agent.comm import JOB_OVER, Comms, Identity
from ddctl_agents.agent.launch import end_rank, own_address, report_exit, run_ranks
from ddctl_agents.agent.loop import GO, STOP, STOP_NOW, StepLoop
from ddctl_agents.agent.notice import Stop, watch
from ddctl_agents.agent.progress import Pace, Progress
from ddctl_agents.agent.roundtrip import RoundTrips
from ddctl_agents.agent.routes import ask_shard, discover, syncer_url_arg
from ddctl_agents.agent.slots import in_flight_argument
from ddctl_agents.agent.subscription import RelayLink
from ddctl_agents.agent.summary import write as write_summary
from ddctl_agents.core.ending import FINISHED, STOPPED
from ddctl_agents.core.pacing import AUTO_MOST
from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.entrypoint import Parser, add_label_option, configure_logging, report
from ddctl_agents.errors import AgentError
from ddctl_agents.jsonable import from_json
from ddctl_agents.relay import server_name
from ddctl_agents.train.assembly import Assembly, learner_index
from ddctl_agents.train.device import DEVICE_CHOICES, describe, resolve_device
from ddctl_agents.train.inner import Placement
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.modelfiles import unpack
from ddctl_agents.train.ranks import Decisions, Ranks, join, leave, share_text
from ddctl_agents.waiting import ready_file, wait_until

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnerOptions:
    syncer: str
    name: str
    token: str
    other_shards: tuple[str, ...] = ()
    """The other shards' URLs of a sharded synchronizer (``syncer`` is one of them; the job is fetched from it)."""
    ca: Path | None = None
    region: str = ""
    summary: Path | None = None
    max_steps: int = 0
    """Stop after this many steps of this process (0: the job's budget)."""
    drain_timeout_s: float = 60.0
    syncer_timeout_s: float = 0.0
    """Dead-man switch: end if the syncer is unreachable this long (0: never)."""
    parallel_uploads: int | None = None
    """Uploads in flight at once, each on its own connection; None: as few as keep the link busy (``core/pacing``)."""
    cadence: int = 1
    """Send each fragment every ``cadence`` periods of H steps (a region on a slow link: ``up --plan``)."""
    device: str = "auto"
    """auto (this rank's GPU if CUDA has one), cuda or cpu."""
    shard: bool = False
    """FSDP2 across the ranks instead of DDP (a model too big for one device)."""
    compile: bool = False
    synthetic_step: float = 0.0
    """> 0: no training; each step waits this long and drifts the model (``train/synthetic.py``, for ``bench wan``)."""
    relay: str = ""
    """The region's relay (``relay/``), which brings the versions; the shards' own streams stand by."""
    relay_token: str = ""
    start_when: Path | None = None
    """Registered and bootstrapped, say so (``ready_file``) and wait for this file before the first step (a benchmark
    starts its learners together)."""


def _register(opts: LearnerOptions) -> tuple[Assembly, Comms, dict[str, Any]]:
    """Fetch the job, build it, register and start the network threads (the leader's part of the start)."""
    client = SyncerClient(opts.syncer, opts.token, opts.ca)
    try:
        job_answer = retry(client.job, give_up_after_s=120.0)
    finally:
        client.close()
    model_files = job_answer.get("model_files") or {}
    assembly = _assemble(job_answer.get("job"), model_files)  # checked there: a job of another shape is a ConfigError
    job = assembly.config
    me = Identity(name=opts.name, incarnation=time.time_ns() // 1000, region=opts.region, cadence=opts.cadence)

    def connect(url: str) -> SyncerClient:
        return SyncerClient(url, opts.token, opts.ca)

    routes = discover((opts.syncer, *opts.other_shards), functools.partial(ask_shard, connect))
    if routes.map is not None:
        routes.map.check_fragments(assembly.fragmentation.count)
    absorb = not job.sync.error_feedback
    relayed = functools.partial(SyncerClient, token=opts.relay_token, ca=opts.ca, server_name=server_name(opts.region))
    relay = RelayLink(opts.relay, relayed) if opts.relay else None  # checked by its region's relay's name, not its address
    comms = Comms(connect, routes, me, job.sync.codec, job.sync.block, parallel_uploads=opts.parallel_uploads, absorb=absorb,
                  relay=relay)  # fmt: skip
    answer = comms.start(assembly.fragmentation.count)
    start = {"job": job_answer["job"], "model_files": model_files, "start_step": int(answer["start_step"])}
    return assembly, comms, start | {"incarnation": me.incarnation}


def _assemble(job: Any, model_files: dict[str, str]) -> Assembly:
    """The job as the syncer sent it, its own model (if any) imported from the files that came with it."""
    return Assembly.build(from_json(JobConfig, job), model_dir=unpack(model_files))


def _start(opts: LearnerOptions, ranks: Ranks, group: Any) -> tuple[Assembly, Comms | None, dict[str, Any]]:
    """Leader: fetch the job and register; every rank gets the job and where to start from the leader."""
    comms, assembly, refused = None, None, None
    start: dict[str, Any] = {}
    if ranks.leader:
        try:
            assembly, comms, start = _register(opts)
        except Refused as exc:  # the other ranks must hear it too, or they would wait for the job forever
            if exc.code != JOB_OVER or ranks.world == 1:
                raise
            refused, start = exc, {"over": exc.reason}
    shared = json.loads(share_text(ranks, json.dumps(start) if ranks.leader else None, group))
    if "over" in shared:
        raise refused or Refused(410, JOB_OVER, str(shared["over"]))
    return assembly or _assemble(shared["job"], shared.get("model_files") or {}), comms, shared


def run_learner(opts: LearnerOptions, stop: threading.Event | None = None, restarts: int = 0) -> dict[str, Any]:
    """Train until the budget, ``stop`` or SIGTERM; returns the summary (also written to opts.summary).

    Under torchrun every rank runs this; only the leader (rank 0) talks to the syncer and writes the summary.
    """
    stop = stop or threading.Event()
    ranks = Ranks.from_env()
    device = resolve_device(opts.device, ranks.local_rank)
    group = join(ranks, device)
    try:
        return _train(opts, stop, ranks, device, group, restarts)
    finally:
        leave(ranks)


def _train(opts: LearnerOptions, stop: threading.Event, ranks: Ranks, device: Any, group: Any, restarts: int) -> dict[str, Any]:
    born = time.time()
    assembly, comms, start = _start(opts, ranks, group)
    placement = Placement(device=device, ranks=ranks, shard=opts.shard, compile=opts.compile)
    learner = assembly.new_learner(
        learner_index(opts.name), start["incarnation"], start["start_step"], placement, opts.cadence, opts.synthetic_step
    )
    hardware = describe(device)

    def should_stop() -> tuple[int, str] | None:
        assert comms is not None
        if stop.is_set():
            return STOP, stop.reason if isinstance(stop, Stop) else "sigterm"
        if opts.syncer_timeout_s and time.monotonic() - comms.last_contact > opts.syncer_timeout_s:
            return STOP_NOW, "syncer_gone"
        if comms.subscriber.started_over.is_set():  # every update would be refused: start again (``agent/again``)
            return STOP_NOW, STARTED_OVER
        return (STOP, STOPPED) if comms.stop_asked.is_set() else None

    loop = StepLoop(learner, Decisions(ranks, 1 + 2 * learner.fragmentation.count, group), comms, should_stop)
    started_at, start_step = time.monotonic(), learner.step
    loop.bootstrap(lambda: time.sleep(0.01))
    bootstrap_s = time.monotonic() - started_at
    if opts.start_when is not None:  # heartbeats go on meanwhile; a stop ends the wait and then the run
        start_file = opts.start_when
        ready_file(start_file, opts.name).touch()
        wait_until(lambda: start_file.exists() or stop.is_set(), timeout_s=3600, every_s=0.05, what=f"the file {start_file}")
    budget = learner.total_steps if opts.max_steps <= 0 else min(learner.total_steps, learner.step + opts.max_steps)
    progress, waits = Progress(total=budget), RoundTrips()
    pace = Pace(tick=time.perf_counter(), last_adopt=learner.step)

    def on_step(loss: Any, value: float | None) -> None:
        loss_read = None if opts.synthetic_step else value  # a synthetic step has no loss to report
        pace.stepped(time.perf_counter(), loss_read, len(loop.outcome.adoptions), learner.step)
        if comms is None:
            return
        step_time = statistics.median(pace.step_times)
        comms.set_report(
            step=learner.step,
            step_time=step_time,
            tokens=learner.ledger.trained // max(len(learner.state), 1),
            tokens_per_s=learner.tokens_per_step / step_time if step_time > 0 else 0.0,
            loss=pace.loss,
            staleness=learner.step - pace.last_adopt,
            due=list(learner.due_steps()),
            accelerator=hardware.accelerator,
            devices=ranks.world,
            memory_gb=hardware.memory_gb,
            train_s=round(pace.train_s, 3),
        )
        progress.report(time.monotonic(), learner, comms)
        waits.observe(time.monotonic(), [f.sent_since_adopt for f in learner.state], loop.outcome.adoptions)

    outcome = loop.run(budget, on_step) if loop.outcome.code == GO else loop.outcome
    loop.flush()
    if comms is None:
        return {}
    reason = outcome.reason or FINISHED
    heard = reason not in ("syncer_gone", STARTED_OVER)  # otherwise nothing pushed would land, and none hears goodbye
    drained = comms.drain(opts.drain_timeout_s) if heard else False
    progress.finish(time.monotonic(), learner, comms, reason)
    trained = learner.ledger.trained // max(len(learner.state), 1)
    comms.close(reason=reason if heard else None, tokens=trained)
    summary = {
        "learner": opts.name,
        "incarnation": start["incarnation"],
        "reason": reason,
        "rebalance_recommended": bool(getattr(stop, "rebalance_recommended", False)),
        "start_step": start_step,
        "step": learner.step,
        "cadence": learner.cadence,
        "synthetic_step": opts.synthetic_step,
        "round_trip": waits.summary(),
        "bootstrap_s": round(bootstrap_s, 3),
        "drained": drained,
        "loss": pace.loss,
        "trained_tokens": learner.ledger.trained,
        "overwritten_tokens": learner.ledger.overwritten,
        "sent_tokens": comms.ledger.sent,
        "acked_tokens": dict(comms.ledger.acked),
        "rejected_tokens": comms.ledger.rejected,
        "absorbed_updates": comms.ledger.absorbed,
        "uploads_in_flight": comms.slots.cap(),
        "unsent_tokens": learner.unsent(),
        "bytes_up": comms.ledger.bytes_up,
        "bytes_down": comms.ledger.bytes_down,
        "train_seconds": round(pace.train_s, 3),
        "accelerator": hardware.accelerator,
        "devices": ranks.world,
        "started_at": round(born, 3),
        "ended_at": round(time.time(), 3),
        "restarts": restarts,
    }
    if opts.summary is not None:
        write_summary(opts.summary, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Run the learner; under torchrun, rank 0 also leaves its exit code for the launcher (``agent/launch.py``)."""
    code = _main(argv)
    report_exit(code)
    if "WORLD_SIZE" in os.environ and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        end_rank(code)
    return code


def _main(argv: list[str] | None) -> int:
    defaults = LearnerOptions(syncer="", name="", token="")
    parser = Parser("ddctl learner run", "Run one Decoupled DiLoCo learner against a syncer.")
    syncer = "The syncer's URL: https://HOST:PORT (http:// for h2c on loopback); once per shard of a sharded one."
    parser.add_argument("--syncer", required=True, action="append", type=syncer_url_arg, help=syncer)
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
    parser.add_argument(
        "--parallel-uploads",
        type=in_flight_argument,
        default="auto" if defaults.parallel_uploads is None else str(defaults.parallel_uploads),
        metavar="auto|N",
        help=f"Uploads in flight at once: N, or auto (as few as keep the measured uplink busy, up to {AUTO_MOST}).",
    )
    parser.add_argument(
        "--cadence",
        type=int,
        choices=CADENCES,
        default=defaults.cadence,
        help="Send each fragment every K periods of H steps (a slow link moves 1/K of the bytes).",
    )
    parser.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default=defaults.device,
        help="Where to train: auto (this rank's GPU if CUDA has one, else the CPU), cuda or cpu.",
    )
    parser.add_argument(
        "--gpus", type=int, default=1, help="Ranks of this one learner (one per GPU; CPU ranks without one), under torchrun."
    )
    parser.add_argument(
        "--shard", action="store_true", help="FSDP2 across the ranks instead of DDP, for a model too big for one device."
    )
    parser.add_argument("--nodes", type=int, default=1, help="Machines this one learner spans (each runs --gpus ranks).")
    parser.add_argument(
        "--rendezvous", default="", help="HOST:PORT of torchrun's c10d rendezvous on one of the nodes (with --nodes)."
    )
    parser.add_argument(
        "--compile", action="store_true", help="Compile the model with torch.compile (slow to start, faster steps)."
    )
    parser.add_argument(
        "--synthetic-step",
        type=float,
        default=defaults.synthetic_step,
        metavar="SECONDS",
        help="Do not train: each step waits SECONDS and drifts the model by a fixed amount (many learners on few cores).",
    )
    relay_host.add_options(parser)
    parser.add_argument("--start-when", type=Path, metavar="FILE",
                        help="Registered and bootstrapped, make FILE.NAME.ready, then wait for FILE to step.")  # fmt: skip
    args = parser.parse_args(argv)
    configure_logging()
    try:
        with relay_host.hosted(args):
            return _learn(parser, args, argv)
    except AgentError as exc:  # the hosted relay's files
        return report(parser.prog, exc)


def _learn(parser: Parser, args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.start_when is not None and args.nodes > 1:
        return report(parser.prog, AgentError("--start-when names a file on one machine; give it with --nodes 1 only"))
    if (args.gpus != 1 or args.nodes != 1) and "WORLD_SIZE" not in os.environ:
        try:
            command_line = list(sys.argv[1:] if argv is None else argv)
            here = own_address(args.rendezvous, args.syncer[0]) if args.nodes > 1 else ""
            return rerun_codes(
                lambda: run_ranks(args.gpus, args.nodes, args.rendezvous, f"ddctl-{args.name}", args.device, command_line, here)
            )
        except AgentError as exc:
            return report(parser.prog, exc)
    try:
        token = args.token or os.environ.get("DDCTL_TOKEN") or (args.token_file.read_text().strip() if args.token_file else "")
        if not token:
            raise AgentError("give the learner's token with --token, --token-file or DDCTL_TOKEN")
        opts = LearnerOptions(
            syncer=args.syncer[0],
            other_shards=tuple(args.syncer[1:]),
            name=args.name,
            token=token,
            ca=args.ca,
            region=args.region,
            summary=args.summary,
            max_steps=args.max_steps,
            syncer_timeout_s=args.syncer_timeout,
            parallel_uploads=args.parallel_uploads,
            cadence=args.cadence,
            device=args.device,
            shard=args.shard,
            compile=args.compile,
            synthetic_step=args.synthetic_step,
            start_when=args.start_when,
            relay=args.relay,
            relay_token=args.relay_token_file.read_text().strip() if args.relay and args.relay_token_file else "",
        )
        if opts.relay and (opts.cadence > 1 or not opts.relay_token):
            raise AgentError("--relay needs --relay-token-file, and --cadence 1: a relay serves every version")
        if not (opts.synthetic_step == 0 or 0 < opts.synthetic_step <= 3600):
            raise AgentError(f"--synthetic-step must be 0 (train) or in (0, 3600] seconds, got {opts.synthetic_step}")
        stop = Stop()
        signal.signal(signal.SIGTERM, lambda *_: stop.trigger("sigterm"))
        if args.notice_url and Ranks.from_env().leader:
            watch(args.notice_url, stop)
        summary = rerun_summaries(lambda restarts: run_learner(opts, stop, restarts), stop.is_set)
    except Refused as exc:
        if exc.code == JOB_OVER:  # nothing left to train: a learner started after the end has nothing to do
            print(f"the job is over: {exc.reason}", file=sys.stderr)
            return 0
        return report(parser.prog, exc, "the syncer refused")
    except (AgentError, OSError) as exc:  # exit codes as ddctl's: 6 for an unreachable syncer, 2 for the rest
        return report(parser.prog, exc, "syncer unreachable" if isinstance(exc, Unavailable) else "")
    if summary:  # the leader's; the other ranks have none
        print(json.dumps(summary), flush=True)
    return exit_code(summary)

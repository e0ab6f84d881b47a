"""The synchronous data-parallel baseline that Decoupled DiLoCo is measured against.

M local processes train one model with real ``torch.distributed`` (gloo, DDP):
every step all-reduces every gradient. Each rank draws its own shard and batch
stream exactly as a Decoupled learner would, so the two see the same token
budget; the bytes a ring all-reduce moves are counted from the buckets DDP says it all-reduces.

Run small (a few seconds on a laptop CPU)::

    from ddctl.local.baseline import run_data_parallel
    from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget
    budget = RunBudget(tokens=40_000, learners=2)
    run_data_parallel(InnerConfig(), DataConfig(max_bytes=1 << 20), budget)
"""

from __future__ import annotations

import datetime
import logging
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddctl.errors import WorkerError
from ddctl.local.rank_watch import BEAT_S, RankWatch, StalledRanks, dump_on_signal, stacks_of
from ddctl_agents.errors import OutOfMemory
from ddctl_agents.train.checksum import params_sha256
from ddctl_agents.train.config import (
    DataConfig,
    InnerConfig,
    RunBudget,
    require,
    steps_per_learner,
)
from ddctl_agents.train.contract import build
from ddctl_agents.train.data import BatchSampler, load_corpus, shard, validation_batches
from ddctl_agents.train.evaluate import evaluate_bpb
from ddctl_agents.train.optim import build_inner_optimizer, inner_lr, inner_step, steps_within_memory
from ddctl_agents.train.presets import get_preset, model_config

COLLECTIVE_TIMEOUT_S = 600.0
"""A rank waiting longer than this on its peers (one died or hung) fails instead of hanging."""

LOSS_EVERY = 10
"""Rank 0 records its training loss every this many steps (and at the last one)."""

POLL_S = 0.5
"""How often the parent checks for workers that died without reporting."""

EXIT_GRACE_S = 30.0
"""How long workers that reported may take to exit before they are killed."""

STALL_S = 300.0
"""A rank waiting on its peers (in the rendezvous or a step) silent this long is stuck (``rank_watch``): half the
collective timeout, so the parent says where well before gloo gives up."""

RESTARTS = 1
"""A run stuck in its rendezvous, before any step, is started again this many times."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    """Everything a worker needs, picklable for the spawn start method."""

    inner: InnerConfig
    data: DataConfig
    budget: RunBudget
    threads: int
    port: int
    keep_params: bool
    stacks: str
    """The folder each rank writes its stack to when the parent asks (``rank_watch.dump_on_signal``)."""


def ring_allreduce_bytes(bucket_bytes: int, learners: int) -> int:
    """Bytes one rank sends (and receives) to ring-all-reduce bucket_bytes: 2(M-1)/M of them."""
    return round(Fraction(2 * (learners - 1) * bucket_bytes, learners))


def _join_group(rank: int, job: _Job) -> None:
    """Join the gloo group through the parent's TCP store on loopback."""
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", job.port, is_master=False, timeout=timeout
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=job.budget.learners, timeout=timeout)


def _wrap_ddp(model: nn.Module) -> DistributedDataParallel:
    """DDP with its own C++ all-reduce. Every rank builds the same model from the seed, so the initial broadcast is
    skipped and every byte moved is a gradient bucket's.

    No Python comm hook: one (a counting wrapper around ``allreduce_hook``) deadlocked a rank at exit in about one run
    in seven on two cores: gloo's worker thread, releasing the hook's Python ``then`` callback, waited for the GIL
    while the main thread, holding it, joined that thread in the reducer's destructor (``py-spy dump --native``)."""
    return DistributedDataParallel(model, init_sync=False)


def _bucket_bytes(ddp: DistributedDataParallel, steps: int) -> int:
    """Bytes of gradient buckets all-reduced over ``steps``: DDP all-reduces every bucket once per backward pass."""
    sizes = str(ddp._get_ddp_logging_data()["bucket_sizes"])  # type: ignore[no-untyped-call]
    return steps * sum(int(size) for size in sizes.split(","))


def _train(
    model: nn.Module, sampler: BatchSampler, steps: int, inner: InnerConfig, log: bool, tell: Callable[[str], None]
) -> list[list[float]]:
    """The step loop, telling the parent it trains every BEAT_S; returns [step, loss] every LOSS_EVERY steps when log
    is set."""
    optimizer = build_inner_optimizer(model, inner)
    curve: list[list[float]] = []
    told = time.monotonic()
    for step in range(steps):
        with steps_within_memory(sampler.batch_size, sampler.seq_len, torch.device("cpu")):
            x, y = sampler.batch(step)
            loss = inner_step(model, optimizer, x, y, inner_lr(step, steps, inner), inner.grad_clip)
        if log and (step % LOSS_EVERY == 0 or step == steps - 1):
            curve.append([step, loss.item()])
        if (now := time.monotonic()) - told >= BEAT_S:
            told = now
            tell("training")
    return curve


def _train_rank(rank: int, job: _Job, tell: Callable[[str], None], send: Callable[[dict[str, Any]], None]) -> None:
    """Train one rank on its shard and stream, telling the parent each phase; rank 0 also evaluates. The report is
    sent before the rank leaves its group (``_leave``): a teardown that hangs then costs the run EXIT_GRACE_S, not
    the report (a CI's rank sat 300 s past training in the DDP wrapper's destructor, its report unsent)."""
    config = model_config(job.inner)
    corpus = load_corpus(job.data)
    learners = job.budget.learners
    steps = steps_per_learner(job.budget, job.inner, config.seq_len)
    model = build(config, job.inner, job.inner.seed)
    sampler = BatchSampler(
        shard(corpus.train, rank, learners),
        job.inner.batch_size,
        config.seq_len,
        seed=job.inner.seed,
        stream=rank,
    )
    if learners > 1:
        tell("joining")
        _join_group(rank, job)
    try:
        tell("training")
        start = time.perf_counter()
        trained = _wrap_ddp(model) if learners > 1 else model
        curve = _train(trained, sampler, steps, job.inner, log=rank == 0, tell=tell)
        train_s = time.perf_counter() - start
        bucket_bytes = _bucket_bytes(trained, steps) if isinstance(trained, DistributedDataParallel) else 0
        params = {name: p.detach() for name, p in model.named_parameters()}
        report: dict[str, Any] = {
            "steps": steps,
            "tokens": steps * job.inner.batch_size * config.seq_len,
            "bucket_bytes": bucket_bytes,
            "params_sha256": params_sha256(params),
            "train_s": train_s,
        }
        if rank == 0:
            tell("evaluating")
            windows, batch_size = job.data.eval_windows, job.inner.batch_size
            report["val_bpb"] = evaluate_bpb(model, validation_batches(corpus.val, config.seq_len, windows, batch_size))
            report["loss_curve"] = curve
            if job.keep_params:  # numpy pickles by value; a shared-memory tensor would die with us
                report["params"] = {name: p.numpy().copy() for name, p in params.items()}
        send(report)
    finally:
        _leave(grouped=learners > 1)  # and the DDP wrapper, if any, goes as this returns: both after the report


def _leave(*, grouped: bool) -> None:
    """Leave the gloo group, if the rank joined one."""
    if grouped:
        dist.destroy_process_group()


def _worker(rank: int, job: _Job, results: Any) -> None:
    """Process entry point: ("phase", rank, phase) as it goes, then ("ok", rank, report), ("said", rank, message) for
    a batch larger than memory (the settings' error, said as one), or ("error", rank, traceback)."""
    try:
        torch.set_num_threads(job.threads)
        stack = dump_on_signal(job.stacks, rank)  # noqa: F841  # open while the rank runs: its stack goes there
        _train_rank(
            rank, job, lambda phase: results.put(("phase", rank, phase)), lambda report: results.put(("ok", rank, report))
        )
    except OutOfMemory as exc:
        results.put(("said", rank, str(exc)))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))


def _collect(results: Any, procs: dict[int, Any], job: _Job, timeout_s: float, stall_s: float) -> dict[int, dict[str, Any]]:
    """Wait for every rank's report; fail fast on an error, a silent death, a stall (``rank_watch``) or the timeout."""
    start = time.monotonic()
    watch = RankWatch(stall_s, start)
    watch.start(procs)
    reports: dict[int, dict[str, Any]] = {}
    while len(reports) < len(procs):
        try:
            status, rank, payload = results.get(timeout=POLL_S)
        except queue.Empty:
            status = ""
        now = time.monotonic()
        if status == "phase":
            watch.hear(rank, payload, now)
        elif status == "said":
            raise OutOfMemory(f"rank {rank}: {payload}")
        elif status == "error" and rank in reports:  # in its teardown: the report it sent stands
            log.warning("data-parallel rank %d failed after its report:\n%s", rank, payload)
        elif status == "error":
            raise WorkerError(f"rank {rank} failed:\n{payload}")
        elif status == "ok":
            reports[rank] = payload
        for r, proc in procs.items():
            if r not in reports and proc.exitcode not in (None, 0):
                raise WorkerError(f"rank {r} died with exit code {proc.exitcode}") from None
        if stuck := watch.stalled(now, reports):
            stacks = stacks_of(job.stacks, {r: procs[r] for r in stuck})
            raise StalledRanks(f"{watch.describe(stuck, now)}\n{stacks}", restartable=watch.restartable(stuck))
        if now - start > timeout_s:
            raise WorkerError(f"data-parallel run exceeded timeout_s={timeout_s:g}") from None
    return reports


def _stop(procs: dict[int, Any], grace_s: float) -> list[int]:
    """Let workers exit within grace_s, then kill what is left, so none outlives the run; returns the ranks killed."""
    killed = []
    for rank, proc in procs.items():
        proc.join(timeout=grace_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
            killed.append(rank)
    return killed


def _summarise(reports: dict[int, dict[str, Any]], learners: int, wall_s: float) -> dict[str, Any]:
    """Merge rank reports into the run's result."""
    lead = reports[0]
    bytes_up = sum(ring_allreduce_bytes(r["bucket_bytes"], learners) for r in reports.values())
    result = {
        "val_bpb": lead["val_bpb"],
        "tokens": sum(r["tokens"] for r in reports.values()),
        "bytes_up": bytes_up,
        "bytes_down": bytes_up,  # a ring all-reduce receives exactly what it sends
        "wall_s": wall_s,
        "train_s": lead["train_s"],
        "params_sha256": lead["params_sha256"],
        "rank_params_sha256": [reports[r]["params_sha256"] for r in range(learners)],
        "steps": lead["steps"],
        "learners": learners,
        "loss_curve": lead["loss_curve"],
    }
    if "params" in lead:
        result["params"] = {name: torch.from_numpy(a) for name, a in lead["params"].items()}
    return result


def run_data_parallel(
    inner: InnerConfig,
    data: DataConfig,
    budget: RunBudget,
    threads_per_rank: int = 1,
    *,
    timeout_s: float = 24 * 3600.0,
    keep_params: bool = False,
    stall_s: float = STALL_S,
) -> dict[str, Any]:
    """Train budget.tokens with budget.learners synchronous DDP ranks and report.

    Each rank takes steps_per_learner(...) steps of inner.batch_size sequences
    (so the global batch is M times a Decoupled learner's) with the same
    schedule. Returns val_bpb (rank 0, final model), tokens, bytes_up/bytes_down
    (ring all-reduce traffic summed over ranks; 0 when M = 1), wall_s, train_s,
    params_sha256 (rank 0) and rank_params_sha256 (all ranks), steps, learners,
    loss_curve and restarts (times the run stuck in its rendezvous was started
    again); with keep_params also rank 0's final "params" (CPU tensors).
    A worker's failure raises WorkerError carrying its traceback; so does
    running past timeout_s, and a rank stuck (``rank_watch``) past the restarts.
    """
    get_preset(inner.preset)  # fail here, not in M processes
    require(threads_per_rank >= 1, f"threads_per_rank must be >= 1, got {threads_per_rank}")
    start = time.monotonic()
    for restarts in range(RESTARTS + 1):
        try:
            with tempfile.TemporaryDirectory(prefix="ddctl-dp-") as stacks:
                job = _Job(inner=inner, data=data, budget=budget, threads=threads_per_rank, port=0, keep_params=keep_params,
                           stacks=stacks)  # fmt: skip
                reports = _attempt(job, range(budget.learners), timeout_s - (time.monotonic() - start), stall_s)
            break
        except StalledRanks as exc:
            if not exc.restartable or restarts == RESTARTS:
                raise
            log.warning("data-parallel run stuck in its rendezvous, starting it again: %s", exc)
    return {**_summarise(reports, budget.learners, time.monotonic() - start), "restarts": restarts}


def _attempt(job: _Job, ranks: range, timeout_s: float, stall_s: float) -> dict[int, dict[str, Any]]:
    """Spawn ``ranks`` of ``job`` (all of them, but for a test) around a fresh TCP store and collect their reports."""
    ctx = torch.multiprocessing.get_context("spawn")
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    store = dist.TCPStore(  # type: ignore[attr-defined]  # port 0: the OS picks a free one
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout
    )
    job = replace(job, port=store.port)
    results = ctx.Queue()
    procs = {rank: ctx.Process(target=_worker, args=(rank, job, results), daemon=True) for rank in ranks}
    for proc in procs.values():
        proc.start()
    try:
        reports = _collect(results, procs, job, timeout_s, stall_s)
    except BaseException:
        _stop(procs, grace_s=0.0)
        raise
    if lingered := _stop(procs, grace_s=EXIT_GRACE_S):
        log.warning("data-parallel ranks %s reported but did not exit within %g s; killed", lingered, EXIT_GRACE_S)
    return reports


__all__ = ["COLLECTIVE_TIMEOUT_S", "STALL_S", "WorkerError", "ring_allreduce_bytes", "run_data_parallel"]

"""``ddctl train``: Decoupled DiLoCo on the in-process virtual cluster, or the DP baseline."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ddctl.cli.choices import Codec, DownCodec, Fragmentation, Merge
from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, print_table, progress_bar
from ddctl.config.job import default
from ddctl.config.train import ClusterConfig
from ddctl_agents.core.shardmap import MAX_SHARDS

CLUSTER = ClusterConfig()


class Baseline(StrEnum):
    dp = "dp"


def train(
    learners: Annotated[int, typer.Option(help="M: number of learners (data-parallel ranks with --baseline dp).")] = 4,
    fragments: Annotated[
        int | None, typer.Option(help=f"P: fragments the model is split into [default: {default('fragments')}].")
    ] = None,
    inner_steps: Annotated[
        int | None,
        typer.Option(help=f"H: inner steps between two sends of the same fragment [default: {default('inner_steps')}]."),
    ] = None,
    overlap: Annotated[
        int | None,
        typer.Option(help=f"tau: steps trained while a fragment is in flight, 0..H [default: {default('overlap')}]."),
    ] = None,
    quorum: Annotated[
        int | None, typer.Option(help=f"K: updates a round needs (K=M is synchronous) [default: {default('quorum')}].")
    ] = None,
    grace: Annotated[
        bool | None, typer.Option(help="Adaptive grace window after the quorum, inside the network slack [default: on].")
    ] = None,
    codec: Annotated[Codec | None, typer.Option(help=f"Outer-gradient codec [default: {default('codec')}].")] = None,
    down_codec: Annotated[
        DownCodec | None, typer.Option(help=f"Codec of fragments sent back [default: {default('down_codec')}].")
    ] = None,
    merge: Annotated[
        Merge | None, typer.Option(help=f"rda (radial-directional) or mean (ablation) [default: {default('merge')}].")
    ] = None,
    fragmentation: Annotated[
        Fragmentation | None,
        typer.Option(help=f"balanced (LPT), layer or tensor (ablations) [default: {default('fragmentation')}]."),
    ] = None,
    error_feedback: Annotated[
        bool | None, typer.Option(help="Carry each fragment's quantisation residual to its next send [default: off].")
    ] = None,
    push_before_overwrite: Annotated[
        bool | None, typer.Option(help="Ablation: send drift a new version would overwrite (off = the paper's plain overwrite).")
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help=f"Model preset: tiny, tiny-moe, small, base, large [default: {default('preset')}].")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Your own network, path/to/file.py:factory or package.module:factory, instead of the preset's."),
    ] = None,
    tokens: Annotated[
        int | None, typer.Option(help=f"Total token budget across all learners [default: {default('tokens')}].")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help=f"Sequences per inner step per learner [default: {default('batch_size')}].")
    ] = None,
    lr: Annotated[float | None, typer.Option(help=f"Peak inner AdamW learning rate [default: {default('lr')}].")] = None,
    outer_lr: Annotated[
        float | None, typer.Option(help=f"Outer Nesterov learning rate [default: {default('outer_lr')}].")
    ] = None,
    outer_momentum: Annotated[
        float | None, typer.Option(help=f"Outer Nesterov momentum [default: {default('outer_momentum')}].")
    ] = None,
    outer_warmup: Annotated[
        int | None,
        typer.Option(
            help=f"Outer steps per fragment over which the outer lr ramps up (0: none) [default: {default('outer_warmup')}]."
        ),
    ] = None,
    max_behind: Annotated[
        int | None,
        typer.Option(help=f"Periods an update may lag and still merge late (0: dropped) [default: {default('max_behind')}]."),
    ] = None,
    late_weight: Annotated[
        str | None,
        typer.Option(
            help=f"How an update behind its fragment's version is weighed: period (one period's tokens) or staleness (that "
            f"over 1 + the versions it is behind) [default: {default('late_weight')}]."
        ),
    ] = None,
    speeds: Annotated[str, typer.Option(help="Relative learner speeds, comma-separated (e.g. 1,1,0.5,0.5).")] = "",
    cadences: Annotated[
        str, typer.Option(help="Per learner, send every k periods (1, 2, 4 or 8), comma-separated (e.g. 1,1,1,4).")
    ] = "",
    outage: Annotated[
        list[str], typer.Option(help="LEARNER@SECONDS[+SECONDS]: learner fails at a virtual time, returns later. Repeatable.")
    ] = [],  # noqa: B006
    failures: Annotated[
        Path | None, typer.Option(help="Replay the learner failures of an availability tape (ddctl simulate --tape).")
    ] = None,
    link_mbps: Annotated[
        float | None, typer.Option(help=f"Virtual link bandwidth per learner, each way [default: {CLUSTER.link_mbps}].")
    ] = None,
    latency_ms: Annotated[
        float | None, typer.Option(help=f"Virtual one-way latency per learner [default: {CLUSTER.latency_ms}].")
    ] = None,
    data: Annotated[
        list[Path], typer.Option(help="Text file or folder to train on (repeatable); default: the Python stdlib's sources.")
    ] = [],  # noqa: B006
    max_bytes: Annotated[
        int | None, typer.Option(help=f"Read at most this many corpus bytes [default: {default('max_bytes')}].")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help=f"Seeds model init, data order and virtual timing [default: {default('seed')}].")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help=f"torch threads (fixed so runs replay bit for bit) [default: {default('threads')}].")
    ] = None,
    shards: Annotated[
        int,
        typer.Option(
            min=1, max=MAX_SHARDS, help="Synchronizer shards owning whole fragments (round robin); each writes its own tape."
        ),
    ] = 1,
    tape: Annotated[
        Path | None, typer.Option(help="Write the event tape (JSON lines) to this new file (RUN.S0.jsonl, ... for shards).")
    ] = None,
    baseline: Annotated[
        Baseline | None, typer.Option(help="Run the synchronous data-parallel baseline instead (torch.distributed, gloo).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Train a model with Decoupled DiLoCo on a virtual cluster (or the DP baseline).

    Small and quick: ddctl train --tokens 200000 --learners 2
    """
    knobs = {
        "learners": learners, "fragments": fragments, "inner_steps": inner_steps, "overlap": overlap, "quorum": quorum,
        "grace": grace, "codec": codec, "down_codec": down_codec, "merge": merge, "fragmentation": fragmentation,
        "error_feedback": error_feedback, "push_before_overwrite": push_before_overwrite, "preset": preset, "model": model,
        "tokens": tokens, "batch_size": batch_size, "lr": lr, "outer_lr": outer_lr, "outer_momentum": outer_momentum,
        "outer_warmup": outer_warmup, "max_behind": max_behind,
        "late_weight": late_weight,
        "data": data or None, "max_bytes": max_bytes, "seed": seed, "threads": threads,
    }  # fmt: skip
    cluster = {"speeds": speeds, "cadences": cadences, "outages": outage, "failures": failures, "link_mbps": link_mbps,
               "latency_ms": latency_ms, "shards": shards}  # fmt: skip

    def body() -> dict[str, Any]:
        from ddctl.cli.train_options import build_config, refuse_decoupled_only

        if baseline is Baseline.dp:
            refuse_decoupled_only(cluster | {"tape": tape})
        config = build_config(knobs, cluster)
        if config.inner.model:  # a broken factory fails here, naming the rule, before any data is read
            from ddctl_agents.train.contract import check_contract
            from ddctl_agents.train.presets import model_config

            check_contract(config.inner.model, model_config(config.inner), fragments=config.sync.fragments)
        with progress_bar("training", config.budget.tokens) as update:
            if baseline is Baseline.dp:
                from ddctl.local.baseline import run_data_parallel

                return run_data_parallel(config.inner, config.data, config.budget, threads_per_rank=config.threads)
            from ddctl.local.training import train_decoupled

            return train_decoupled(config, tape, update)

    result = run_guarded(body)
    if json_out:
        print_json(result)
    else:
        keys = ("val_bpb", "tokens", "bytes_up", "bytes_down", "rounds", "wall_s", "params_sha256")
        rows = {k: result[k] for k in keys if k in result}
        if "tapes" in result:  # where they went: one per shard
            rows["tapes"] = ", ".join(result["tapes"])
        print_table("ddctl train", rows)

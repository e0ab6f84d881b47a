"""``ddctl train``: Decoupled DiLoCo on the in-process virtual cluster, or the DP baseline."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, print_table, progress_bar


class Baseline(StrEnum):
    dp = "dp"


class Codec(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    int8 = "int8"
    int4 = "int4"
    int2 = "int2"
    int1 = "int1"


class Merge(StrEnum):
    rda = "rda"
    mean = "mean"


class Fragmentation(StrEnum):
    balanced = "balanced"
    layer = "layer"
    tensor = "tensor"


def train(
    learners: Annotated[int, typer.Option(help="M: number of learners (data-parallel ranks with --baseline dp).")] = 4,
    fragments: Annotated[int, typer.Option(help="P: fragments the model is split into.")] = 24,
    inner_steps: Annotated[int, typer.Option(help="H: inner steps between two sends of the same fragment.")] = 24,
    overlap: Annotated[int, typer.Option(help="tau: steps a learner trains while a fragment is in flight.")] = 2,
    quorum: Annotated[int, typer.Option(help="K: updates needed before a round may close (K=M is synchronous).")] = 1,
    grace: Annotated[bool, typer.Option(help="Adaptive grace window after the quorum, inside the network slack.")] = True,
    codec: Annotated[Codec, typer.Option(help="Outer-gradient codec.")] = Codec.int4,
    down_codec: Annotated[str, typer.Option(help="Codec for fragments sent back to learners: bf16 or fp32.")] = "bf16",
    merge: Annotated[Merge, typer.Option(help="rda (radial-directional) or mean (ablation).")] = Merge.rda,
    fragmentation: Annotated[
        Fragmentation, typer.Option(help="balanced (LPT), layer or tensor (ablations).")
    ] = Fragmentation.balanced,
    error_feedback: Annotated[bool, typer.Option(help="Carry each fragment's quantisation residual to its next send.")] = False,
    push_before_overwrite: Annotated[
        bool, typer.Option(help="Ablation: send drift a new version would overwrite (off = the paper's plain overwrite).")
    ] = False,
    preset: Annotated[str, typer.Option(help="Model preset: tiny, tiny-moe, small, base, large.")] = "tiny",
    tokens: Annotated[int, typer.Option(help="Total token budget across all learners.")] = 1_000_000,
    batch_size: Annotated[int, typer.Option(help="Sequences per inner step per learner.")] = 8,
    lr: Annotated[float, typer.Option(help="Peak inner AdamW learning rate.")] = 3e-3,
    outer_lr: Annotated[float, typer.Option(help="Outer Nesterov learning rate.")] = 0.4,
    outer_momentum: Annotated[float, typer.Option(help="Outer Nesterov momentum.")] = 0.8,
    speeds: Annotated[str, typer.Option(help="Relative learner speeds, comma-separated (e.g. 1,1,0.5,0.5).")] = "",
    outage: Annotated[
        list[str], typer.Option(help="LEARNER@SECONDS[+SECONDS]: learner fails at a virtual time, returns later. Repeatable.")
    ] = [],  # noqa: B006
    failures: Annotated[
        Path | None, typer.Option(help="Replay the learner failures of an availability tape (ddctl simulate --tape).")
    ] = None,
    link_mbps: Annotated[float, typer.Option(help="Virtual link bandwidth per learner, each way.")] = 100.0,
    latency_ms: Annotated[float, typer.Option(help="Virtual one-way latency per learner.")] = 50.0,
    data: Annotated[
        list[Path], typer.Option(help="Text file or folder to train on (repeatable); default: the Python stdlib's sources.")
    ] = [],  # noqa: B006
    max_bytes: Annotated[int, typer.Option(help="Read at most this many corpus bytes.")] = 24 * 2**20,
    seed: Annotated[int, typer.Option(help="Seeds model init, data order and virtual timing.")] = 0,
    threads: Annotated[int, typer.Option(help="torch threads (fixed so runs replay bit for bit).")] = 1,
    tape: Annotated[Path | None, typer.Option(help="Write the event tape (JSON lines) to this new file.")] = None,
    baseline: Annotated[
        Baseline | None, typer.Option(help="Run the synchronous data-parallel baseline instead (torch.distributed, gloo).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Train a model with Decoupled DiLoCo on a virtual cluster (or the DP baseline).

    Small and quick: ddctl train --tokens 200000 --learners 2
    """
    options = dict(locals())

    def body() -> dict[str, Any]:
        from ddctl.cli.train_options import build_config

        config = build_config(options)
        with progress_bar("training", config.budget.tokens) as update:
            if baseline is Baseline.dp:
                from ddctl.baseline import run_data_parallel

                return run_data_parallel(config.inner, config.data, config.budget, threads_per_rank=config.threads)
            from ddctl.training import train_decoupled

            return train_decoupled(config, tape, update)

    result = run_guarded(body)
    if json_out:
        print_json(result)
    else:
        keys = ("val_bpb", "tokens", "bytes_up", "bytes_down", "rounds", "wall_s", "params_sha256")
        print_table("ddctl train", {k: result[k] for k in keys if k in result})

"""`ddctl train`: run a Decoupled DiLoCo job on the virtual cluster and report it.

Thin shell: assemble, run, evaluate, write the tapes' first and last records
(one tape per synchronizer shard: ``run.jsonl`` becomes ``run.S0.jsonl``, ...).
The result's keys are shared with the data-parallel baseline so the two can be
compared line by line.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ddctl.config.train import TrainConfig, to_json
from ddctl.local.virtual_cluster import Progress, VirtualCluster
from ddctl_agents.core.shardmap import round_robin
from ddctl_agents.core.tape import TAPE_FORMAT, TapeWriter
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checksum import params_sha256


def train_decoupled(config: TrainConfig, tape_path: Path | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Train to the token budget; returns val_bpb, tokens, bytes, wall time and the params hash."""
    started = time.perf_counter()
    paths = shard_tapes(tape_path, config.cluster.shards) if tape_path else []
    for path in paths:  # every one checked before any is written: a refused run leaves nothing behind
        if path.exists() and path.stat().st_size > 0:
            raise FileExistsError(f"tape {path} already exists; choose a new path (tapes are append-only records of one run)")
    assembly = Assembly.build(config)
    tapes: list[TapeWriter] = []
    try:
        names = round_robin(len(paths), assembly.fragmentation.count).shards if len(paths) > 1 else (None,) * len(paths)
        for path, name in zip(paths, names, strict=True):
            tapes.append(_open_tape(path, assembly, name))
        cluster = VirtualCluster(assembly, tapes, progress)
        stats = cluster.run()
        params = cluster.shards.global_params()
        result = {
            "mode": "decoupled",
            "val_bpb": assembly.evaluate(params),
            "tokens": stats.tokens,
            "bytes_up": stats.bytes_up,
            "bytes_down": stats.bytes_down,
            "wall_s": time.perf_counter() - started,
            "params_sha256": params_sha256(params),
            "learners": config.budget.learners,
            "rounds": cluster.shards.rounds_closed,
            "shards": config.cluster.shards,
            "virtual_time_s": stats.virtual_time_s,
            "round_causes": dict(sorted(stats.causes.items())),
            "ledger": _ledger(cluster, stats, assembly.fragmentation.count),
            "loss_curve": stats.loss_curve,
            **assembly.describe(),
        }
        for tape in tapes:
            tape.write(
                {"type": "end", "t": stats.virtual_time_s, "params_sha256": result["params_sha256"], "val_bpb": result["val_bpb"]}
            )
        if paths:
            result["tapes"] = [str(p) for p in paths]
        return result
    finally:
        for tape in tapes:
            tape.close()


def shard_tapes(path: Path, shards: int) -> list[Path]:
    """Where a run's tapes go: ``path`` itself for one synchronizer; ``run.S0.jsonl``, ... beside it for shards."""
    if shards == 1:
        return [path]
    return [path.with_name(f"{path.stem}.S{i}{path.suffix}") for i in range(shards)]


def _open_tape(path: Path, assembly: Assembly, shard: str | None) -> TapeWriter:
    path.parent.mkdir(parents=True, exist_ok=True)
    tape = TapeWriter(path)
    header = {"type": "config", "format": TAPE_FORMAT, "config": to_json(assembly.config), **assembly.describe()}
    tape.write(header | ({"shard": shard} if shard else {}))
    return tape


def _ledger(cluster: VirtualCluster, stats: Any, fragments: int) -> dict[str, Any]:
    """Tokens by fate. Balanced means: every trained token was sent, overwritten by a newer
    version, or lost with its learner; every sent one was received or lost in flight; and
    every received one was merged, late-merged, dropped or is pending (ALGORITHM.md §4)."""
    syncer, learner = cluster.shards.ledger(), stats.learner_ledger
    unsent = learner.trained - learner.sent - learner.overwritten - stats.lost_at_failure
    balanced = syncer.balanced() and syncer.received + stats.lost_in_flight == learner.sent and unsent == 0
    return {
        **syncer.as_tokens(fragments),
        "trained": learner.trained / fragments,
        "overwritten": learner.overwritten / fragments,
        "lost_in_flight": stats.lost_in_flight / fragments,
        "lost_at_failure": stats.lost_at_failure / fragments,
        "unsent": unsent / fragments,
        "balanced": balanced,
    }

"""How fast a learner trains here, and what the outer sync costs it: ``python -m ddctl_agents.train.speed``.

For each rank count it starts the learner's ranks (torchrun beyond one), trains
a preset on this machine's device and times blocks of steps two ways,
alternating so that drift in clocks or temperature hits both alike:

- **without sync**: inner steps only;
- **with sync**: the learner's real step loop (``agent.loop.StepLoop``) with
  fragments due every ``inner_steps``: parameter snapshots copied to pinned host
  memory on a side stream, drift computed and int4-encoded on the host (in a
  thread, as the uploaders do), new versions decoded and adopted between steps,
  decisions broadcast across ranks. Only the network is missing: a local peer
  answers each update with the fragment's next version at once.

It prints one JSON line: tokens/s, MFU (from ``train.flops``) and the step time
with sync over without, per rank count. Needs only torch and the agents folder,
so a GPU machine can run it in one short visit (``scripts/gpu-check``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ddctl_agents.agent.loop import REPORT_EVERY, StepLoop
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.core.messages import FragmentVersion, Update, decode_fragment, encode_fragment, encode_update
from ddctl_agents.train import flops
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget, SyncSettings
from ddctl_agents.train.device import describe, resolve_device
from ddctl_agents.train.inner import Placement
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.ranks import Decisions, Ranks, join, leave

OUTER_LR = 0.7


class EncodingPeer:
    """The learner's side of outer sync without a network: encode each update (int4), answer with a version."""

    def __init__(self, initial: dict[str, torch.Tensor], names: list[list[str]], codec: str, block: int) -> None:
        self.values = {name: value.clone() for name, value in initial.items()}
        self.names, self.codec, self.block = names, codec, block
        self.versions = [0] * len(names)
        self.updates, self.bytes_up = 0, 0
        self._inbox: queue.Queue[Update] = queue.Queue()
        self._out: queue.Queue[FragmentVersion] = queue.Queue()
        for p in range(len(names)):
            self._publish(p)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Let the encoder finish what it holds: a thread inside torch at interpreter exit aborts the process."""
        self._stopping.set()
        self._thread.join()

    def _publish(self, p: int) -> None:
        message = FragmentVersion(fragment=p, version=self.versions[p], tensors={n: self.values[n] for n in self.names[p]})
        self._out.put(decode_fragment(encode_fragment(message, "bf16", self.block))[0])

    def _work(self) -> None:
        while not (self._stopping.is_set() and self._inbox.empty()):
            try:
                update = self._inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            self.bytes_up += len(encode_update(update, self.codec, self.block))
            for name, delta in update.tensors.items():
                self.values[name] -= OUTER_LR * delta
            self.versions[update.fragment] += 1
            self.updates += 1
            self._publish(update.fragment)

    def send(self, update: Update) -> None:
        self._inbox.put(update)

    def arrivals(self) -> list[FragmentVersion]:
        out = []
        while not self._out.empty():
            out.append(self._out.get_nowait())
        return out


def _job(preset: str, batch: int) -> JobConfig:
    return JobConfig(
        inner=InnerConfig(preset=preset, batch_size=batch),
        data=DataConfig(max_bytes=4 << 20, eval_windows=1),
        budget=RunBudget(tokens=10**12, learners=1),
        sync=SyncSettings(fragments=8, inner_steps=8),
        syncer=SyncerConfig(inner_steps=8),
        threads=max(1, (os.cpu_count() or 2) // 2),
    )


def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker(args: argparse.Namespace) -> None:
    """One rank: alternate timed blocks without and with outer sync; the leader writes the figures."""
    ranks = Ranks.from_env()
    device = resolve_device(args.device, ranks.local_rank)
    group = join(ranks, device)
    try:
        assembly = Assembly.build(_job(args.preset, args.batch))
        placement = Placement(device=device, ranks=ranks, shard=args.shard, compile=args.compile)
        learner = assembly.new_learner(0, placement=placement)
        names = [[spec.name for spec in fragment] for fragment in assembly.fragmentation.fragments]
        peer = EncodingPeer(assembly.initial, names, "int4", assembly.config.sync.block) if ranks.leader else None
        loop = StepLoop(learner, Decisions(ranks, 1 + 2 * len(names), group), peer)
        loop.bootstrap(lambda: time.sleep(0.001))
        for _ in range(args.warmup):  # compilation, allocator and autotuning settle here
            learner.train_step()
        loop.run(learner.step + 2 * learner.sync.inner_steps)  # every fragment's send path warmed too
        times: dict[str, list[float]] = {"without": [], "with": []}
        for block in range(2 * args.blocks):
            mode = ("without", "with")[block % 2]
            _sync_device(device)
            started = time.perf_counter()
            if mode == "with":
                loop.run(learner.step + args.steps)
            else:
                for _ in range(args.steps):
                    loss = learner.train_step()
                    if learner.step % REPORT_EVERY == 0:  # the loop reads its loss as often
                        learner.trainer.loss_mean(loss)
            _sync_device(device)
            times[mode].append((time.perf_counter() - started) / args.steps)
        if ranks.leader and peer is not None:
            peer.close()
            hardware = describe(device)
            Path(args.out).write_text(
                json.dumps(_figures(assembly, learner.tokens_per_step, ranks.world, hardware.accelerator, times, peer))
            )
    finally:
        leave(ranks)


def _figures(
    assembly: Assembly, tokens_per_step: int, world: int, accelerator: str, times: dict[str, list[float]], peer: EncodingPeer
) -> dict[str, Any]:
    without, with_sync = min(times["without"]), min(times["with"])
    tokens_per_s = tokens_per_step / without
    return {
        "ranks": world,
        "accelerator": accelerator,
        "step_s_without_sync": round(without, 6),
        "step_s_with_sync": round(with_sync, 6),
        "sync_cost": round(with_sync / without - 1.0, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu": None if (m := flops.mfu(tokens_per_s, assembly.model_config, accelerator, world)) is None else round(m, 4),
        "updates": peer.updates,
        "bytes_up": peer.bytes_up,
    }


def measure(
    preset: str,
    ranks: list[int],
    device: str,
    batch: int,
    steps: int,
    blocks: int,
    warmup: int,
    compile: bool,
    shard: bool = False,
) -> dict[str, Any]:
    """Run the worker once per rank count (under torchrun beyond one) and gather the figures."""
    resolve_device(device)  # a bad or missing device fails here, not in every rank
    config = Assembly.build(_job(preset, batch)).model_config
    runs = []
    for world in ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "figures.json"
            flags = ["--preset", preset, "--device", device, "--batch", str(batch), "--steps", str(steps)]
            flags += (
                ["--blocks", str(blocks), "--warmup", str(warmup), "--worker", "--out", str(out)]
                + (["--compile"] if compile else [])
                + (["--shard"] if shard else [])
            )
            launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"] if world > 1 else []
            env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
            command = [sys.executable, *launcher, "-m", "ddctl_agents.train.speed", *flags]
            subprocess.run(command, check=True, env=env, stdout=sys.stderr)  # stdout carries only the result
            runs.append(json.loads(out.read_text()))
    one = next((r for r in runs if r["ranks"] == 1), None)
    for run in runs:
        run["speedup_over_one_rank"] = round(run["tokens_per_s"] / one["tokens_per_s"], 3) if one else None
    return {
        "preset": preset,
        "flops_per_token": flops.flops_per_token(config),
        "batch": batch,
        "compile": compile,
        "shard": shard,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddctl_agents.train.speed", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--ranks", default="1", help="Comma-separated rank counts to measure, e.g. 1,8.")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--batch", type=int, default=8, help="Sequences per learner step (split over the ranks).")
    parser.add_argument("--steps", type=int, default=16, help="Steps per timed block.")
    parser.add_argument("--blocks", type=int, default=3, help="Timed blocks of each kind (the fastest counts).")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--shard", action="store_true", help="FSDP2 across the ranks instead of DDP.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    ranks = [int(r) for r in args.ranks.split(",") if r]
    result = measure(args.preset, ranks, args.device, args.batch, args.steps, args.blocks, args.warmup, args.compile, args.shard)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

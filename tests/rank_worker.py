"""One learner's ranks against a local, deterministic outer step (run by torchrun, or directly for one rank).

The peer stands in for the synchronizer: every update it is sent becomes the
fragment's next version at once (global - 0.7 x outer gradient), so when and what
a learner adopts depends only on the learner's own steps. That makes a 2-rank
learner comparable step for step with a 1-rank one. Each rank writes the steps
at which it adopted what (``rank{r}.json``); the leader also writes the final
parameters (``params.pt``), gathered whole when the model is sharded.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/rank_worker.py OUT --batch 8 --steps 24
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ddctl_agents.agent.loop import StepLoop
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.core.fragments import Fragmentation
from ddctl_agents.core.messages import FragmentVersion, Update
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget, SyncSettings
from ddctl_agents.train.inner import Placement
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.ranks import Decisions, Ranks, join, leave

OUTER_LR = 0.7
INNER_STEPS = 4
FRAGMENTS = 4


class OuterStepPeer:
    """A synchronizer for one learner, answering every update with the next version of its fragment."""

    def __init__(self, initial: dict[str, torch.Tensor], fragmentation: Fragmentation) -> None:
        self.values = {name: value.clone() for name, value in initial.items()}
        self.names = [[spec.name for spec in fragment] for fragment in fragmentation.fragments]
        self.versions = [0] * fragmentation.count
        self.sent: list[Update] = []
        self._out = [self._version(p) for p in range(fragmentation.count)]

    def _version(self, p: int) -> FragmentVersion:
        return FragmentVersion(fragment=p, version=self.versions[p], tensors={n: self.values[n].clone() for n in self.names[p]})

    def send(self, update: Update) -> None:
        self.sent.append(update)
        for name, delta in update.tensors.items():
            self.values[name] -= OUTER_LR * delta
        self.versions[update.fragment] += 1
        self._out.append(self._version(update.fragment))

    def arrivals(self) -> list[FragmentVersion]:
        out, self._out = self._out, []
        return out


def job(batch: int, model: str = "") -> JobConfig:
    return JobConfig(
        inner=InnerConfig(preset="tiny", batch_size=batch, warmup_steps=4, model=model),
        data=DataConfig(max_bytes=1 << 20),
        budget=RunBudget(tokens=1_000_000, learners=1),
        sync=SyncSettings(fragments=FRAGMENTS, inner_steps=INNER_STEPS, codec="fp32"),
        syncer=SyncerConfig(inner_steps=INNER_STEPS),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--shard", action="store_true")
    parser.add_argument("--model", default="", help="A model of your own (train/contract.py); default: the built-in.")
    args = parser.parse_args()
    ranks = Ranks.from_env()
    group = join(ranks, torch.device("cpu"))
    try:
        assembly = Assembly.build(job(args.batch, args.model))
        learner = assembly.new_learner(0, placement=Placement(ranks=ranks, shard=args.shard))
        peer = OuterStepPeer(assembly.initial, assembly.fragmentation) if ranks.leader else None
        loop = StepLoop(learner, Decisions(ranks, 1 + 2 * FRAGMENTS, group), peer)
        loop.bootstrap(lambda: None)
        loop.run(args.steps)
        loop.flush()
        full = {name: p.full_tensor() if learner.trainer.sharded else p.detach() for name, p in learner.params.items()}  # type: ignore[attr-defined]
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"adoptions": loop.outcome.adoptions, "step": learner.step, "trained": learner.ledger.trained}
        if peer is not None:
            record["sent_tokens"] = sum(u.c_tokens for u in peer.sent)
            torch.save({name: value.clone() for name, value in full.items()}, args.out / "params.pt")
        (args.out / f"rank{ranks.rank}.json").write_text(json.dumps(record))
    finally:
        leave(ranks)


if __name__ == "__main__":
    main()

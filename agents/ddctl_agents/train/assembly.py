"""Build the parts of a run from its config: corpus, model, layout, syncer, learners.

The virtual cluster, the replayer, the syncer service and the learner agent
assemble runs the same way through this module: that is what makes a replay
bit-identical to its run, and every process of a job agree on the layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ddctl_agents.core.admission import UpdateLimits, derive_limits
from ddctl_agents.core.fragments import Fragmentation, TensorSpec, fragment_tensors
from ddctl_agents.core.shard_syncer import ShardSynchronizer
from ddctl_agents.core.shardmap import ShardRole
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.errors import ConfigError
from ddctl_agents.train import contract, presets
from ddctl_agents.train.checksum import params_sha256
from ddctl_agents.train.config import ModelConfig, steps_per_learner
from ddctl_agents.train.data import BatchSampler, Corpus, load_corpus, require_vocab, shard, validation_batches
from ddctl_agents.train.evaluate import evaluate_bpb
from ddctl_agents.train.inner import InnerTrainer, Placement
from ddctl_agents.train.job import JobConfig
from ddctl_agents.train.learner import Learner
from ddctl_agents.train.synthetic import SyntheticTrainer


def learner_name(index: int) -> str:
    return f"L{index}"


def learner_index(name: str) -> int:
    """Inverse of learner_name; a name it never produced is a ConfigError."""
    if not (name.startswith("L") and name[1:].isdigit()):
        raise ConfigError(f"learner names look like L0, L1, ...; got {name!r}")
    return int(name[1:])


@dataclass(slots=True)
class Assembly:
    """Everything derived deterministically from a TrainConfig."""

    config: JobConfig
    model_config: ModelConfig
    corpus: Corpus
    initial: dict[str, torch.Tensor]
    fragmentation: Fragmentation
    embeddings: frozenset[str]
    total_steps: int
    val: list[tuple[torch.Tensor, torch.Tensor]]
    model_dir: Path | None = None
    """Where a model of your own is imported from (``train/modelfiles.py``); None: installed or a file path."""

    @classmethod
    def build(cls, config: JobConfig, corpus: Corpus | None = None, model_dir: Path | None = None) -> Assembly:
        torch.set_num_threads(config.threads)
        model_config = presets.model_config(config.inner)
        corpus = corpus or load_corpus(config.data)
        require_vocab(corpus, model_config.vocab_size)
        model = contract.build(model_config, config.inner, config.inner.seed, model_dir)
        initial = {k: v.detach().clone() for k, v in model.named_parameters()}
        embeddings = contract.embeddings_of(model)
        specs = [TensorSpec(name=n, shape=tuple(p.shape), is_embedding=n in embeddings) for n, p in model.named_parameters()]
        fragmentation = fragment_tensors(specs, config.sync.fragments, config.fragmentation)
        return cls(
            config=config,
            model_config=model_config,
            corpus=corpus,
            initial=initial,
            fragmentation=fragmentation,
            embeddings=embeddings,
            total_steps=steps_per_learner(config.budget, config.inner, model_config.seq_len),
            val=validation_batches(corpus.val, model_config.seq_len, config.data.eval_windows, config.inner.batch_size),
            model_dir=model_dir,
        )

    def new_model(self) -> torch.nn.Module:
        """The job's model at the seed's initialisation (``train/contract.py``)."""
        return contract.build(self.model_config, self.config.inner, self.config.inner.seed, self.model_dir)

    def flops_per_token(self) -> int:
        """Training FLOPs per token of the job's model, behind MFU."""
        return contract.model_flops(self.config.inner, self.model_config, sum(v.numel() for v in self.initial.values()))

    def new_syncer(self, role: ShardRole | None = None, max_steps: int | None = None) -> Synchronizer:
        """The job's synchronizer at its initial model; ``role``: one shard of a sharded one, owning what its map says;
        ``max_steps``: the most steps one learner may claim (default: its share of the budget)."""
        limits = self.update_limits(max_steps)
        if role is not None:
            return ShardSynchronizer(self.initial, self.fragmentation, self.embeddings, self.config.syncer, limits, role)
        return Synchronizer(self.initial, self.fragmentation, self.embeddings, self.config.syncer, limits)

    def update_limits(self, max_steps: int | None = None) -> UpdateLimits:
        """What an update of this job may claim: drift from the inner AdamW, one batch per step, the run's steps."""
        return derive_limits(
            lr=self.config.inner.lr,
            weight_decay=self.config.inner.weight_decay,
            tokens_per_step=self.config.inner.batch_size * self.model_config.seq_len,
            max_steps=max_steps or self.total_steps,
            initial=self.initial,
            trust=self.config.syncer.trust,
        )

    def new_learner(
        self,
        index: int,
        incarnation: int = 0,
        start_step: int = 0,
        placement: Placement | None = None,
        cadence: int = 1,
        synthetic_step: float = 0.0,
    ) -> Learner:
        """A fresh learner process: model at the seed's init (bootstrap overwrites it), new AdamW.

        ``placement``: its device and ranks (default: one CPU process, as every simulation runs);
        ``cadence``: it sends each fragment every ``cadence`` periods; ``synthetic_step``: > 0 plays each step
        as a wait of that many seconds and a fixed drift instead of training (``train/synthetic.py``).
        """
        model = self.new_model()
        data = shard(self.corpus.train, index, self.config.budget.learners)
        sampler = BatchSampler(
            data, self.config.inner.batch_size, self.model_config.seq_len, seed=self.config.inner.seed, stream=index
        )
        where = placement or Placement()
        trainer = (
            SyntheticTrainer(model, self.config.inner, sampler, where, synthetic_step, index)
            if synthetic_step > 0
            else InnerTrainer(model, self.config.inner, sampler, where)
        )
        return Learner(
            name=learner_name(index),
            trainer=trainer,
            inner=self.config.inner,
            sync=self.config.sync,
            fragmentation=self.fragmentation,
            total_steps=self.total_steps,
            start_step=start_step,
            incarnation=incarnation,
            cadence=cadence,
        )

    def evaluate(self, params: dict[str, torch.Tensor]) -> float:
        """Validation bits per byte of the model holding ``params``: per token over the bytes a token stands for,
        where tokenised data says (``Corpus.val_bytes_per_token``); per token where it cannot."""
        model = self.new_model()
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(params[name])
        return evaluate_bpb(model, self.val) / (self.corpus.val_bytes_per_token or 1.0)

    def describe(self) -> dict[str, object]:
        return {
            "params": sum(v.numel() for v in self.initial.values()),
            "fragment_sizes": self.fragmentation.sizes(),
            "fragment_imbalance": round(self.fragmentation.imbalance(), 4),
            "corpus_sha256": self.corpus.sha256,
            "initial_sha256": params_sha256(self.initial),
            "steps_per_learner": self.total_steps,
        }

"""Typed settings shared by every way of training: learners, the virtual cluster
and the data-parallel baseline. Validation happens on creation so a bad value
fails at the edge with a message, not deep inside a training loop."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from ddctl_agents.core import schedule
from ddctl_agents.core.choices import CODECS, DEFAULT_BLOCK, MAX_BLOCK, MIN_BLOCK, block_ok
from ddctl_agents.core.vclock import MOST_LEARNERS
from ddctl_agents.errors import ConfigError


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ok: keeps validation blocks one line per rule."""
    if not ok:
        raise ConfigError(message)


MODEL_SPEC = re.compile(r"(?P<where>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*|[^:]+\.py):(?P<factory>[A-Za-z_]\w*)")
"""``package.module:factory`` or ``path/to/file.py:factory`` (the contract: ``ddctl_agents.train.contract``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InnerConfig:
    """The inner (per-learner) optimisation: model, batch, AdamW and its schedule."""

    preset: str = "tiny"
    """Model preset name (see ddctl_agents.train.presets.PRESETS)."""
    batch_size: int = 8
    """Sequences per inner step on one learner (one data-parallel rank in the baseline)."""
    lr: float = 3e-3
    """Peak inner AdamW learning rate."""
    warmup_steps: int = 20
    """Linear warm-up length in inner steps."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of lr."""
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables it."""
    seed: int = 0
    """Seeds model initialisation and every learner's data order."""
    vocab_size: int | None = None
    """The model's vocabulary, overriding its preset's 256 bytes: tokenised data's (``ddctl data prepare``)."""
    model: str = ""
    """Your own network: ``package.module:factory`` or ``path/to/file.py:factory`` (``train/contract.py``
    says what the factory must return); empty means the built-in transformer."""

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        require(0 < self.lr < math.inf, f"lr must be a finite number > 0, got {self.lr}")
        require(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        require(0 <= self.weight_decay < math.inf, f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        require(all(0 <= b < 1 for b in self.betas), f"betas must be in [0, 1), got {self.betas}")
        require(self.grad_clip >= 0, f"grad_clip must be >= 0, got {self.grad_clip}")
        require(
            self.vocab_size is None or 2 <= self.vocab_size <= 2**32,
            f"vocab_size must be in [2, 2**32] (or unset: the preset's), got {self.vocab_size}",
        )
        require(
            not self.model or MODEL_SPEC.fullmatch(self.model) is not None,
            f"model must be package.module:factory or path/to/file.py:factory (empty: built-in), got {self.model!r}",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig:
    """Where the training data comes from and how it is split: text (bytes) or pre-tokenised shards.

    The default is the stdlib's sources as bytes; ``token_paths`` switches to token shards
    (the format is described in ``ddctl_agents.train.tokens``)."""

    paths: tuple[Path, ...] = ()
    """Text files or folders; empty means the Python standard library's .py files."""
    token_paths: tuple[str, ...] = ()
    """Pre-tokenised shards instead of text: ``*.bin`` files, folders of them, or ``s3://``/``gs://``
    prefixes; each shard has its JSON sidecar. Exclusive with ``paths``; the model's vocab_size must
    equal the shards' vocab_size."""
    max_bytes: int = 24 * 2**20
    """Read at most this many bytes of text corpus (files in sorted order); token shards are read whole."""
    val_fraction: float = 0.05
    """Fraction of files or token shards (by a stable hash of their relative name) held out for validation."""
    eval_windows: int = 64
    """Validation windows of seq_len+1 tokens (bytes for text) used for val_bpb."""

    def __post_init__(self) -> None:
        require(self.max_bytes >= 4096, f"max_bytes must be >= 4096, got {self.max_bytes}")
        require(0 < self.val_fraction < 0.5, f"val_fraction must be in (0, 0.5), got {self.val_fraction}")
        require(self.eval_windows >= 1, f"eval_windows must be >= 1, got {self.eval_windows}")
        object.__setattr__(self, "paths", tuple(Path(p) for p in self.paths))
        object.__setattr__(self, "token_paths", tuple(str(p) for p in self.token_paths))
        require(
            not (self.paths and self.token_paths),
            "give text paths or token_paths, not both (text is read as bytes, token shards as their tokenizer's ids)",
        )
        require(all(self.token_paths), "token_paths must not contain an empty path")


MOST_TOKENS = 2**53
"""A budget's ceiling: exact as a float (token weights, every JSON reader), and some 600 times the largest published
pre-training run; a budget past it is a typo, which would otherwise train until stopped."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunBudget:
    """How much training: a total token budget shared by all learners."""

    tokens: int = 1_000_000
    learners: int = 4

    def __post_init__(self) -> None:
        require(1 <= self.tokens <= MOST_TOKENS, f"tokens must be in [1, 2**53], got {self.tokens}")
        require(1 <= self.learners <= MOST_LEARNERS, f"learners must be in [1, {MOST_LEARNERS}], got {self.learners}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Shape of the network; every preset is one of these."""

    vocab_size: int = 256
    """Token vocabulary; 256 means raw bytes, so no tokenizer is needed."""
    seq_len: int = 128
    """Context length in tokens (size of the positional embedding)."""
    d_model: int = 128
    """Width of the residual stream."""
    n_layer: int = 4
    """Number of transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide d_model."""
    mlp_ratio: int = 4
    """Hidden width of each MLP (or expert) as a multiple of d_model."""
    n_experts: int = 0
    """Experts per mixture-of-experts layer; 0 means a dense MLP in every block."""
    top_k: int = 2
    """Experts each token is routed to (MoE only)."""
    aux_loss_coef: float = 0.01
    """Weight of the load-balancing loss added to the training loss (MoE only)."""
    tie_embeddings: bool = True
    """Reuse the token embedding as the output projection (saves vocab_size x d_model)."""

    def __post_init__(self) -> None:
        require(self.vocab_size >= 2, f"vocab_size must be >= 2, got {self.vocab_size}")
        require(self.seq_len >= 1, f"seq_len must be >= 1, got {self.seq_len}")
        require(self.d_model >= 1, f"d_model must be >= 1, got {self.d_model}")
        require(self.n_layer >= 1, f"n_layer must be >= 1, got {self.n_layer}")
        require(self.n_head >= 1, f"n_head must be >= 1, got {self.n_head}")
        require(
            self.d_model % self.n_head == 0,
            f"n_head must divide d_model, got n_head={self.n_head}, d_model={self.d_model}",
        )
        require(self.mlp_ratio >= 1, f"mlp_ratio must be >= 1, got {self.mlp_ratio}")
        require(
            self.n_experts == 0 or self.n_experts >= 2,
            f"n_experts must be 0 (dense) or >= 2, got {self.n_experts}",
        )
        if self.n_experts:
            require(
                1 <= self.top_k <= self.n_experts,
                f"top_k must be in [1, n_experts={self.n_experts}], got {self.top_k}",
            )
        require(self.aux_loss_coef >= 0, f"aux_loss_coef must be >= 0, got {self.aux_loss_coef}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncSettings:
    """How a learner talks to the syncer."""

    fragments: int = 24
    inner_steps: int = 24
    codec: str = "int4"
    block: int = DEFAULT_BLOCK
    error_feedback: bool = False
    """[ours] Keep each fragment's quantisation residual and add it to its next outer gradient."""
    push_before_overwrite: bool = False
    """Ablation: when a version arrives from a round this learner had no part in, send the drift
    it is about to overwrite first (it folds into the next round as a late update) instead of
    discarding it. Off (the paper's plain overwrite) measured better: stale drift hurt more
    than discarded drift (docs/benchmarks.md)."""

    def __post_init__(self) -> None:
        schedule.check_schedule(self.fragments, self.inner_steps)
        if self.codec not in CODECS:
            raise ConfigError(f"codec must be one of {', '.join(CODECS)}, got {self.codec!r}")
        require(block_ok(self.block), f"block must be a multiple of 8 in [{MIN_BLOCK}, {MAX_BLOCK}], got {self.block!r}")


def steps_per_learner(budget: RunBudget, inner: InnerConfig, seq_len: int) -> int:
    """Inner steps each learner takes so that all learners together see budget.tokens."""
    per_step = budget.learners * inner.batch_size * seq_len
    return max(1, budget.tokens // per_step)


__all__ = ["ConfigError", "ModelConfig", "SyncSettings", "DataConfig", "InnerConfig", "RunBudget", "require", "steps_per_learner"]

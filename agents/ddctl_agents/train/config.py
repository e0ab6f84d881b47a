"""Typed settings shared by every way of training: learners, the virtual cluster
and the data-parallel baseline. Validation happens on creation so a bad value
fails at the edge with a message, not deep inside a training loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddctl_agents.errors import ConfigError


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ok: keeps validation blocks one line per rule."""
    if not ok:
        raise ConfigError(message)


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

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        require(self.lr > 0, f"lr must be > 0, got {self.lr}")
        require(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        require(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        require(all(0 <= b < 1 for b in self.betas), f"betas must be in [0, 1), got {self.betas}")
        require(self.grad_clip >= 0, f"grad_clip must be >= 0, got {self.grad_clip}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig:
    """Where text comes from and how it is split; the default is the stdlib's sources."""

    paths: tuple[Path, ...] = ()
    """Text files or folders; empty means the Python standard library's .py files."""
    max_bytes: int = 24 * 2**20
    """Read at most this many bytes of corpus (files in sorted order)."""
    val_fraction: float = 0.05
    """Fraction of files (by a stable hash of their relative path) held out for validation."""
    eval_windows: int = 64
    """Validation windows of seq_len+1 bytes used for val_bpb."""

    def __post_init__(self) -> None:
        require(self.max_bytes >= 4096, f"max_bytes must be >= 4096, got {self.max_bytes}")
        require(0 < self.val_fraction < 0.5, f"val_fraction must be in (0, 0.5), got {self.val_fraction}")
        require(self.eval_windows >= 1, f"eval_windows must be >= 1, got {self.eval_windows}")
        object.__setattr__(self, "paths", tuple(Path(p) for p in self.paths))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunBudget:
    """How much training: a total token budget shared by all learners."""

    tokens: int = 1_000_000
    learners: int = 4

    def __post_init__(self) -> None:
        require(self.tokens >= 1, f"tokens must be >= 1, got {self.tokens}")
        require(1 <= self.learners <= 64, f"learners must be in [1, 64], got {self.learners}")


def steps_per_learner(budget: RunBudget, inner: InnerConfig, seq_len: int) -> int:
    """Inner steps each learner takes so that all learners together see budget.tokens."""
    per_step = budget.learners * inner.batch_size * seq_len
    return max(1, budget.tokens // per_step)


__all__ = ["ConfigError", "DataConfig", "InnerConfig", "RunBudget", "require", "steps_per_learner"]

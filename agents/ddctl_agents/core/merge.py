"""Turn several learners' outer gradients for one fragment into one.

Token weights say how much each learner's update is worth: quantity of data
times tokens per step, ``c_tokens**2 / c_steps``. Radial-directional averaging
(RDA) averages norms and unit directions separately because outer gradients of
different learners are nearly orthogonal: a plain mean would shrink like
1/sqrt(M) and the outer learning rate would need retuning for every M.
Embedding tensors use the plain weighted mean (their rows are sparse updates).

[ours] RDA only where its premise holds, measured at every merge: the mean
keeps ``alignment = |sum w v| / sum w |v|`` of the updates' norm, and orthogonal
updates would keep ``sqrt(sum (w |v|)^2) / sum w |v|`` (1/sqrt(M) for equal
ones). Updates measurably more aligned than that share their signal, the mean
has not shrunk it, and RDA would only scale the merged step up: at H = 24 on the
tiny preset learners kept 0.65-0.92 of their norm (orthogonal: 0.5), RDA scaled
the step 1.1-1.5x, and that cost 0.2 bpb with outer momentum 0.9. Such tensors
take the plain mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ddctl_agents.core.choices import MERGES
from ddctl_agents.errors import MergeError

DEGENERATE_COSINE = 1e-6
"""[ours] RDA falls back to the weighted mean when the mean direction's norm is
below this (the unit directions cancel), where normalising would amplify noise."""
PREMISE_MARGIN = 0.25
"""[ours] How much more aligned than orthogonal updates may be, as a share of the way from orthogonal
to parallel, and still count as orthogonal (high-dimensional noise is never exactly orthogonal)."""


def token_weight(c_tokens: int, c_steps: int) -> float:
    """w = c_tokens * (c_tokens / c_steps): data seen times tokens per step; 0 if absent."""
    if c_steps <= 0 or c_tokens <= 0:
        return 0.0
    return c_tokens * (c_tokens / c_steps)


def weighted_mean(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Sum_m w_m v_m / Sum_m w_m, accumulated in fp32."""
    total = _check(vectors, weights)
    out = torch.zeros_like(vectors[0], dtype=torch.float32)
    for v, w in zip(vectors, weights, strict=True):
        if w:
            out.add_(v, alpha=w / total)
    return out


def radial_directional_average(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """(weighted mean of norms) * normalize(weighted mean of unit directions): the paper's RDA, always."""
    return _rda(vectors, weights, margin=None)


def premise_checked_rda(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """RDA if the updates are about as orthogonal as its premise says, else the weighted mean (module docstring)."""
    return _rda(vectors, weights, margin=PREMISE_MARGIN)


def _rda(vectors: Sequence[torch.Tensor], weights: Sequence[float], margin: float | None) -> torch.Tensor:
    """One pass over the vectors for both the mean and RDA; ``margin`` None skips the premise check."""
    total = _check(vectors, weights)
    direction = torch.zeros_like(vectors[0], dtype=torch.float32)
    mean = torch.zeros_like(vectors[0], dtype=torch.float32)
    radius = squares = 0.0
    for v, w in zip(vectors, weights, strict=True):
        if not w:
            continue
        norm = float(torch.linalg.vector_norm(v))
        radius += w * norm / total
        squares += (w * norm / total) ** 2
        mean.add_(v, alpha=w / total)
        if norm > 0.0:
            direction.add_(v, alpha=w / (total * norm))
    scale = rda_scale(radius, squares, float(torch.linalg.vector_norm(mean)), float(torch.linalg.vector_norm(direction)), margin)
    return mean if scale is None else direction.mul_(scale)


def rda_scale(radius: float, squares: float, mean_norm: float, strength: float, margin: float | None) -> float | None:
    """What the summed unit directions are scaled by, or None where the weighted mean is the answer.

    ``radius`` = sum w|v| / sum w, ``squares`` = sum (w|v| / sum w)^2, ``strength`` = |sum w v/|v|| / sum w."""
    if strength < DEGENERATE_COSINE:
        return None
    if margin is not None and radius > 0.0:
        orthogonal = math.sqrt(squares) / radius
        if mean_norm / radius > orthogonal + margin * (1.0 - orthogonal):
            return None
    return radius / strength


def merge_tensor(
    vectors: Sequence[torch.Tensor], weights: Sequence[float], *, is_embedding: bool, method: str = "rda"
) -> torch.Tensor:
    """Merge one tensor: RDA where its premise holds (or mean, the ablation); embeddings always average."""
    if method not in MERGES:
        raise MergeError(f"unknown merge {method!r}; allowed: {', '.join(MERGES)}")
    if method == "mean" or is_embedding:
        return weighted_mean(vectors, weights)
    return premise_checked_rda(vectors, weights)


@dataclass(frozen=True, slots=True, kw_only=True)
class Contribution:
    """One learner's decoded outer gradient for a fragment, with its counters."""

    learner: str
    tensors: Mapping[str, torch.Tensor]
    c_steps: int
    c_tokens: int
    periods: int = 1
    """The learner's cadence k: it brings k periods of drift to one round."""
    stale: int = 0
    """Versions its base is behind, where the job weighs staleness (``SyncerConfig.late_weight``); else 0."""

    @property
    def weight(self) -> float:
        """The token weight of one period: a learner at cadence k counted with all k periods' tokens took most of
        the step of each round it joined, from a base k - 1 rounds old (at k = 4 val_bpb +0.13 against +0.05 weighed
        as one period, docs/benchmarks.md). Over ``1 + stale`` where staleness is weighed."""
        return token_weight(self.c_tokens, self.c_steps) / self.periods / (1 + self.stale)


def merge_fragment(
    contributions: Sequence[Contribution], embeddings: frozenset[str], method: str = "rda"
) -> dict[str, torch.Tensor]:
    """Merge every tensor of a fragment across contributions (ordered by learner for determinism)."""
    ordered = sorted(contributions, key=lambda c: c.learner)
    if not ordered:
        raise MergeError("cannot merge a fragment with no contributions")
    names = sorted(ordered[0].tensors)
    for c in ordered:
        if sorted(c.tensors) != names:
            raise MergeError(f"learner {c.learner} sent tensors {sorted(c.tensors)}, expected {names}")
    weights = [c.weight for c in ordered]
    return {
        name: merge_tensor([c.tensors[name] for c in ordered], weights, is_embedding=name in embeddings, method=method)
        for name in names
    }


def _check(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> float:
    if len(vectors) != len(weights) or not vectors:
        raise MergeError(f"need one weight per vector and at least one vector, got {len(vectors)}/{len(weights)}")
    shape = vectors[0].shape
    if any(v.shape != shape for v in vectors):
        raise MergeError(f"shapes differ: {[tuple(v.shape) for v in vectors]}")
    if any(w < 0 for w in weights):
        raise MergeError(f"weights must be >= 0, got {list(weights)}")
    total = float(sum(weights))
    if total <= 0.0:
        raise MergeError("at least one weight must be positive")
    return total

"""A round's merge and outer step in one native pass per tensor, over updates still packed.

Why: the round is the syncer's hot loop (``packed`` says what it costs decoded). The
decisions are merge.py's and outer.py's, unchanged: token weights, RDA where its premise
holds and the weighted mean elsewhere (and for embeddings), the Nesterov step with its
warm-up. Only the arithmetic moves. Every choice is a linear combination ``sum c_m v_m`` of
the updates: one pass over their codes writes it into the result's memory (``packed_combine``),
and a light pass takes the step from it (``step_from``). RDA needs the norms of the mean and of
the summed unit directions before it can choose: the updates' norms come from their codes
(``Packed.stats``), and the same one pass writes both combinations with their norms.
The step keeps the largest |value| it writes, so the result's check (``admission``)
reads neither new tensor again.

The result agrees with the reference to float32 rounding, not bit for bit, so a run and
its replay must take the same path; both decode updates with ``decode_update``, which
keeps int8/int4 updates packed whenever the kernels are there. Anything else (a round
with an update restored from a snapshot, two updates of one learner added together, an
fp32 codec, a layout the reference would refuse) answers None and takes the reference path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ddctl_agents.core import _native
from ddctl_agents.core.admission import MeasuredTensors
from ddctl_agents.core.choices import MERGES
from ddctl_agents.core.config import OuterConfig
from ddctl_agents.core.merge import PREMISE_MARGIN, Contribution, rda_scale
from ddctl_agents.core.packed import Packed, PackedTensors

Fragment = dict[str, torch.Tensor]


def fused_outer_step(
    params: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
    contributions: Sequence[Contribution],
    *,
    embeddings: frozenset[str],
    method: str,
    config: OuterConfig,
    taken: int,
) -> tuple[Fragment, Fragment] | None:
    """(params, buffers) after merging ``contributions`` and stepping; None where the reference path must run."""
    ordered = sorted(contributions, key=lambda c: c.learner)
    packs = [c.tensors.packed for c in ordered if isinstance(c.tensors, PackedTensors)]
    weights = [c.weight for c in ordered]
    total = float(sum(weights))
    if method not in MERGES or not packs or len(packs) < len(ordered) or total <= 0.0 or _native.kernels() is None:
        return None
    if any(set(p) != set(params) for p in packs) or any(w < 0 for w in weights):
        return None
    live = [(p, w / total) for p, w in zip(packs, weights, strict=True) if w]
    shares = [share for _, share in live]
    new_params: Fragment = {}
    new_buffers: Fragment = {}
    largest: dict[str, tuple[float, float]] = {}
    for name, theta in params.items():
        tensors = [p[name] for p, _ in live]
        buf = buffers.get(name)
        if not _uniform(tensors, theta, buf):
            return None
        theta = theta.contiguous()
        out = torch.empty_like(theta), torch.empty_like(theta)
        momentum = (config.momentum, config.lr_at(taken), config.nesterov)
        step = _Step(theta, None if buf is None else buf.contiguous(), momentum, out)
        largest[name] = (_mean_step if method == "mean" or name in embeddings else _rda_step)(tensors, shares, step)
        new_params[name], new_buffers[name] = out
    return (
        MeasuredTensors(new_params, {name: top for name, (top, _) in largest.items()}),
        MeasuredTensors(new_buffers, {name: top for name, (_, top) in largest.items()}),
    )


def _uniform(tensors: list[Packed], theta: torch.Tensor, buf: torch.Tensor | None) -> bool:
    """One codec and block, the fragment's shape, and float32 state the kernel can read."""
    first = tensors[0]
    same = all(t.codec == first.codec and t.block == first.block and t.shape == tuple(theta.shape) for t in tensors)
    state_ok = theta.dtype == torch.float32 and (buf is None or (buf.dtype == torch.float32 and buf.shape == theta.shape))
    return same and state_ok


def _addresses(tensors: list[Packed]) -> tuple[list[int], list[int]]:
    return [t.scales for t in tensors], [t.codes for t in tensors]


@dataclass(frozen=True, slots=True)
class _Step:
    """One tensor's outer step: its values, its momentum (None: it starts at the delta), (mu, lr, nesterov), and the
    two new tensors (theta', buf') it writes, which also hold the combinations before the step reads them."""

    theta: torch.Tensor
    buf: torch.Tensor | None
    momentum: tuple[float, float, bool]
    out: tuple[torch.Tensor, torch.Tensor]

    def take(self, delta: torch.Tensor, scale: float) -> tuple[float, float]:
        """The step with delta = ``scale`` * ``delta`` (one of ``out``: each element is read before it is written);
        the largest |value| of each of ``out`` (NaN where one is NaN)."""
        buf = None if self.buf is None else self.buf.data_ptr()
        theta, out = self.theta, (self.out[0].data_ptr(), self.out[1].data_ptr())
        return _native.step_from(delta.data_ptr(), scale, theta.numel(), theta.data_ptr(), buf, self.momentum, out)


def _mean_step(tensors: list[Packed], shares: list[float], step: _Step) -> tuple[float, float]:
    """outer.outer_step of merge.weighted_mean: the mean into ``out[0]``, then the step from it."""
    first, mean = tensors[0], step.out[0]
    _native.packed_combine(first.codec, *_addresses(tensors), [shares], first.numel, first.block, [mean.data_ptr()])
    return step.take(mean, 1.0)


def _rda_step(tensors: list[Packed], shares: list[float], step: _Step) -> tuple[float, float]:
    """outer.outer_step of merge.premise_checked_rda: both combinations into ``out``, then the step from one."""
    norms = [t.norm() for t in tensors]
    if not all(math.isfinite(n) for n in norms):
        return _mean_step(tensors, shares, step)  # refused at admission; the result's check decides
    radius = sum(a * n for a, n in zip(shares, norms, strict=True))
    squares = sum((a * n) ** 2 for a, n in zip(shares, norms, strict=True))
    directions = [a / n if n > 0.0 else 0.0 for a, n in zip(shares, norms, strict=True)]
    first, (mean, direction) = tensors[0], step.out
    mean2, strength2 = _native.packed_combine(
        first.codec, *_addresses(tensors), [shares, directions], first.numel, first.block, [mean.data_ptr(), direction.data_ptr()]
    )
    scale = rda_scale(radius, squares, math.sqrt(mean2), math.sqrt(strength2), PREMISE_MARGIN)
    return step.take(mean, 1.0) if scale is None else step.take(direction, scale)

"""A round's merge and outer step in one native pass per tensor, over updates still packed.

Why: the round is the syncer's hot loop (``packed`` says what it costs decoded). The
decisions are merge.py's and outer.py's, unchanged: token weights, RDA where its premise
holds and the weighted mean elsewhere (and for embeddings), the Nesterov step with its
warm-up. Only the arithmetic moves. Every choice is a linear combination ``sum c_m v_m`` of
the updates. The mean is formed and stepped in one pass over the codes (``packed_combine_step``)
and never written. RDA needs the norms of the mean and of the summed unit directions before it
can choose: the updates' norms come from their codes (``Packed.stats``), one pass writes both
combinations with their norms (``packed_combine``), and a light pass takes the step from the
one chosen (``step_from``). The step keeps the largest |value| it writes, so the result's check
(``admission``) reads neither new tensor again.

The result agrees with the reference to float32 rounding, not bit for bit, so a run and
its replay must take the same path; both decode updates with ``decode_update``, which
keeps int8/int4 updates packed whenever the kernels are there. A learner's updates added
together for one round (``packed.PackedSum``) stay packed too: each enters the pass with
the learner's coefficient, and RDA takes the norm of their sum in a pass of its own.
A snapshot keeps a pending update packed too (``packed.stored``), so a recovered round fuses
as the live one did. Anything else (an update decoded already, an fp32 codec, a layout
the reference would refuse) answers None and takes the reference path.
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
from ddctl_agents.core.packed import Packed, packed_parts

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
    found = [packed_parts(c.tensors) for c in ordered]
    packs = [[part.packed for part in parts] for parts in found if parts is not None]
    weights = [c.weight for c in ordered]
    total = float(sum(weights))
    if method not in MERGES or not packs or len(packs) < len(ordered) or total <= 0.0 or _native.kernels() is None:
        return None
    if any(set(part) != set(params) for parts in packs for part in parts) or any(w < 0 for w in weights):
        return None
    live = [(parts, w / total) for parts, w in zip(packs, weights, strict=True) if w]
    shares = [share for _, share in live]
    new_params: Fragment = {}
    new_buffers: Fragment = {}
    top_params: dict[str, float] = {}
    top_buffers: dict[str, float] = {}
    for name, theta in params.items():
        tensors = [[part[name] for part in parts] for parts, _ in live]
        buf = buffers.get(name)
        if not _uniform([t for parts in tensors for t in parts], theta, buf):
            return None
        theta = theta.contiguous()
        out = torch.empty_like(theta), torch.empty_like(theta)
        momentum = (config.momentum, config.lr_at(taken), config.nesterov)
        step = _Step(theta, None if buf is None else buf.contiguous(), momentum, out)
        kept = (_mean_step if method == "mean" or name in embeddings else _rda_step)(tensors, shares, step)
        (new_params[name], new_buffers[name]), (top_params[name], top_buffers[name]) = out, kept
    return MeasuredTensors(new_params, top_params), MeasuredTensors(new_buffers, top_buffers)


def _uniform(tensors: list[Packed], theta: torch.Tensor, buf: torch.Tensor | None) -> bool:
    """One codec and block, the fragment's shape, and float32 state the kernel can read."""
    first = tensors[0]
    same = all(t.codec == first.codec and t.block == first.block and t.shape == tuple(theta.shape) for t in tensors)
    state_ok = theta.dtype == torch.float32 and (buf is None or (buf.dtype == torch.float32 and buf.shape == theta.shape))
    return same and state_ok


Learners = list[list[Packed]]
"""One tensor of each learner's contribution: its packed updates (several where ``rounds.accumulate`` added them)."""


def _per_update(tensors: Learners, coefficients: list[float]) -> tuple[list[Packed], list[float]]:
    """Every learner's updates in one list, each given its learner's coefficient (so sum_m c_m v_m, where v_m is
    learner m's updates added up)."""
    return [t for parts in tensors for t in parts], [c for c, parts in zip(coefficients, tensors, strict=True) for _ in parts]


def _addresses(flat: list[Packed]) -> tuple[list[int], list[int]]:
    return [t.scales for t in flat], [t.codes for t in flat]


def _combine(tensors: Learners, coefficients: list[list[float]], out: list[torch.Tensor]) -> list[float]:
    """out[k] = sum_m c[k][m] v_m for each row k (at most two), in one pass over the codes; their squared norms.
    ``out`` empty: the norms only, nothing written."""
    rows = [_per_update(tensors, row) for row in coefficients]
    flat, addresses = rows[0][0], _addresses(rows[0][0])
    return _native.packed_combine(
        flat[0].codec, *addresses, [c for _, c in rows], flat[0].numel, flat[0].block, [o.data_ptr() for o in out]
    )


def _norm(parts: list[Packed]) -> float:
    """The L2 norm of one learner's tensor: from its codes' stats, or for updates added up, one pass over them."""
    return parts[0].norm() if len(parts) == 1 else math.sqrt(_combine([parts], [[1.0]], [])[0])


@dataclass(frozen=True, slots=True)
class _Step:
    """One tensor's outer step: its values, its momentum (None: it starts at the delta), (mu, lr, nesterov), and the
    two new tensors (theta', buf') it writes (which may hold combinations before the step reads them)."""

    theta: torch.Tensor
    buf: torch.Tensor | None
    momentum: tuple[float, float, bool]
    out: tuple[torch.Tensor, torch.Tensor]

    def take(self, tensors: Learners, coefficients: list[float], scale: float) -> tuple[float, float]:
        """The step with delta = ``scale`` * sum_m c_m v_m, combined and stepped in one native pass; the largest
        |value| of each of ``out`` (NaN where one is NaN)."""
        flat, per_update = _per_update(tensors, coefficients)
        buf = None if self.buf is None else self.buf.data_ptr()
        step = (self.theta.numel(), self.theta.data_ptr(), buf, self.momentum, (self.out[0].data_ptr(), self.out[1].data_ptr()))
        return _native.packed_combine_step(flat[0].codec, _addresses(flat), per_update, flat[0].block, scale, step)

    def take_from(self, delta: torch.Tensor, scale: float) -> tuple[float, float]:
        """The step with delta = ``scale`` * ``delta``, a combination already written (one of ``out``: each element is
        read before it is written); the largest |value| of each of ``out`` (NaN where one is NaN)."""
        buf = None if self.buf is None else self.buf.data_ptr()
        theta, out = self.theta, (self.out[0].data_ptr(), self.out[1].data_ptr())
        return _native.step_from(delta.data_ptr(), scale, theta.numel(), theta.data_ptr(), buf, self.momentum, out)


def _mean_step(tensors: Learners, shares: list[float], step: _Step) -> tuple[float, float]:
    """outer.outer_step of merge.weighted_mean: the mean formed and stepped in one pass, never written."""
    return step.take(tensors, shares, 1.0)


def _rda_step(tensors: Learners, shares: list[float], step: _Step) -> tuple[float, float]:
    """outer.outer_step of merge.premise_checked_rda: both combinations into ``out`` with their norms in one pass, then
    the step from the one chosen. (Forming the chosen one again with the step, as the mean does, costs more: a pass
    over the codes is bound by decoding them, not by writing the result.)"""
    norms = [_norm(parts) for parts in tensors]
    if not all(math.isfinite(n) for n in norms):
        return _mean_step(tensors, shares, step)  # refused at admission; the result's check decides
    radius = sum(a * n for a, n in zip(shares, norms, strict=True))
    squares = sum((a * n) ** 2 for a, n in zip(shares, norms, strict=True))
    directions = [a / n if n > 0.0 else 0.0 for a, n in zip(shares, norms, strict=True)]
    mean, direction = step.out
    mean2, strength2 = _combine(tensors, [shares, directions], [mean, direction])
    scale = rda_scale(radius, squares, math.sqrt(mean2), math.sqrt(strength2), PREMISE_MARGIN)
    return step.take_from(mean, 1.0) if scale is None else step.take_from(direction, scale)

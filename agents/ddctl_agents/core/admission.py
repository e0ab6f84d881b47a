"""What the syncer admits: an update's exact layout and plausible numbers, and a merged result.

Learners are authenticated but not trusted with the job. An update is checked
here before the syncer logs or acknowledges it: the fragment's exact tensor
names, shapes and dtype, finite values, counters a real learner could have, and
a magnitude no inner optimiser could exceed in the steps the update claims. A
round's merged result is checked again before it is published; when it fails,
``admit_merge`` finds the contributions that caused it so the round can be
recomputed from the rest. Pure: tensors and numbers in, a verdict out.

The drift bound [ours]: AdamW moves a parameter by ``lr * m_hat / sqrt(v_hat)``
plus ``lr * wd * theta`` per step. ``|m_hat / sqrt(v_hat)|`` is at most about
``(1 - b1) / sqrt(1 - b2) / sqrt(1 - b1**2 / b2)`` by Cauchy-Schwarz (1.2 for the
default betas, exactly 1 on the first step), so ``ADAM_STEP_BOUND = 3`` times
``drift_safety`` leaves a wide margin for legitimate updates (quantisation
error feedback included) while refusing anything that could overflow a merge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ddctl_agents.core.config import TrustConfig
from ddctl_agents.core.merge import Contribution
from ddctl_agents.core.messages import Update
from ddctl_agents.core.packed import absmax_of, shape_of
from ddctl_agents.core.text import clip

ADAM_STEP_BOUND = 3.0
"""[ours] Largest |AdamW step| / lr per element that the drift bound allows for (see the module docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateLimits:
    """Concrete bounds for one job (``derive_limits``); the defaults only keep arithmetic finite."""

    drift_per_step: float = 1.0e6
    """Largest |outer gradient| per element for each inner step the update claims."""
    max_steps: int = 1 << 40
    """Largest c_steps of one update (the steps a learner can take in the whole run)."""
    tokens_per_step: int = 1 << 40
    """Largest c_tokens / c_steps (one inner batch)."""
    param_bound: float = 1.0e30
    """Largest |value| of a published fragment or outer-momentum buffer."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an update or a contribution is refused; ``code`` is one of errors.REJECTIONS. The reason may quote what the
    update carried (its tensor names), so it is bounded (``text.clip``): its log record must always take it."""

    code: str
    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", clip(self.reason))


def derive_limits(
    *,
    lr: float,
    weight_decay: float,
    tokens_per_step: int,
    max_steps: int,
    initial: Mapping[str, torch.Tensor],
    trust: TrustConfig,
) -> UpdateLimits:
    """The bounds for a job whose inner optimiser peaks at ``lr`` and whose model starts at ``initial``."""
    scale = max([1.0, *(_absmax(t) for t in initial.values())])
    per_step = trust.drift_safety * lr * (ADAM_STEP_BOUND + weight_decay * scale)
    return UpdateLimits(
        drift_per_step=per_step, max_steps=max_steps, tokens_per_step=tokens_per_step, param_bound=trust.result_bound * scale
    )


def check_update(update: Update, expected: Mapping[str, torch.Tensor], limits: UpdateLimits) -> Rejection | None:
    """None if ``update`` may enter a round of the fragment whose current values are ``expected``."""
    problem = _check_counters(update, limits)
    if problem is not None:
        return problem
    if set(update.tensors) != set(expected):
        return Rejection(
            "bad_update", f"fragment {update.fragment} holds {sorted(expected)}, update has {sorted(update.tensors)}"
        )
    bound = update.c_steps * limits.drift_per_step
    for name in update.tensors:
        want = expected[name]
        shape, dtype = shape_of(update.tensors, name)
        if shape != tuple(want.shape) or dtype != torch.float32:
            return Rejection(
                "bad_update",
                f"tensor {name!r} is {dtype} {shape}, fragment {update.fragment} holds float32 {tuple(want.shape)}",
            )
        packed = absmax_of(update.tensors, name)
        largest = _absmax(update.tensors[name]) if packed is None else packed
        if not math.isfinite(largest):
            return Rejection("non_finite", f"tensor {name!r} contains NaN or Inf")
        if largest > bound:
            return Rejection(
                "out_of_bounds",
                f"tensor {name!r} moves a parameter by {largest:.4g}; {update.c_steps} inner steps move one by at most "
                f"{bound:.4g} ({limits.drift_per_step:.4g} per step)",
            )
    return None


class MeasuredTensors(dict[str, torch.Tensor]):
    """Tensors whose max |value| the pass that wrote them also kept (``largest``, NaN where one holds a NaN), so the
    result's check reads none of them again: the fused round's step writes the new values and momentum this way."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], largest: Mapping[str, float]) -> None:
        super().__init__(tensors)
        self.largest = dict(largest)


def check_result(params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor], limits: UpdateLimits) -> str | None:
    """None if a fragment's new values and momentum may be published; else why not."""
    for kind, tensors in (("parameter", params), ("momentum", buffers)):
        known = tensors.largest if isinstance(tensors, MeasuredTensors) else {}
        for name, t in tensors.items():
            largest = known[name] if name in known else _absmax(t)
            if not math.isfinite(largest):
                return f"{kind} {name!r} would become NaN or Inf"
            if largest > limits.param_bound:
                return f"{kind} {name!r} would reach |{largest:.4g}|, beyond the bound {limits.param_bound:.4g}"
    return None


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    """The contributions a round keeps, those it sets aside (with why), and the result (None: none kept)."""

    kept: list[Contribution]
    culprits: list[tuple[Contribution, str]]
    result: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None


Attempt = Callable[[Sequence[Contribution]], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]


def admit_merge(contributions: Sequence[Contribution], attempt: Attempt, limits: UpdateLimits) -> MergeOutcome:
    """Merge ``contributions`` with ``attempt``; if the result fails ``check_result``, drop the culprits.

    A contribution is a culprit when its result alone fails; if every one passes alone
    (the failure needs several), the largest are dropped one by one until the rest pass.
    Deterministic, so a log replay sets aside exactly what the live syncer did.
    """
    result = attempt(contributions)
    problem = check_result(*result, limits)
    if problem is None:
        return MergeOutcome(kept=list(contributions), culprits=[], result=result)
    culprits: list[tuple[Contribution, str]] = []
    kept: list[Contribution] = []
    for c in contributions:
        alone = check_result(*attempt([c]), limits)
        if alone is None:
            kept.append(c)
        else:
            culprits.append((c, alone))
    by_size = sorted(kept, key=lambda c: (-max(_absmax(t) for t in c.tensors.values()), c.learner))
    while kept:
        result = attempt(kept)
        problem = check_result(*result, limits)
        if problem is None:
            return MergeOutcome(kept=kept, culprits=culprits, result=result)
        largest = by_size.pop(0)
        kept = [c for c in kept if c is not largest]
        culprits.append((largest, f"together with the others: {problem}"))
    return MergeOutcome(kept=[], culprits=culprits, result=None)


def _check_counters(update: Update, limits: UpdateLimits) -> Rejection | None:
    if update.c_steps < 1 or update.c_tokens < 1:
        return Rejection("bad_update", f"c_steps and c_tokens must be >= 1, got {update.c_steps}/{update.c_tokens}")
    if update.c_steps > min(limits.max_steps, max(update.step, 1)):
        return Rejection(
            "out_of_bounds",
            f"c_steps {update.c_steps} exceeds the steps a learner can have taken (step {update.step}, "
            f"at most {limits.max_steps} in this job)",
        )
    if update.c_tokens > update.c_steps * limits.tokens_per_step:
        return Rejection(
            "out_of_bounds",
            f"c_tokens {update.c_tokens} over {update.c_steps} steps exceeds {limits.tokens_per_step} tokens per step",
        )
    return None


def _absmax(t: torch.Tensor) -> float:
    """max |t| (NaN if any value is NaN); aminmax propagates NaN and is ~10x faster than abs().max()."""
    if t.numel() == 0:
        return 0.0
    lo, hi = (float(x) for x in torch.aminmax(t.detach().reshape(-1).float()))
    return math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi)

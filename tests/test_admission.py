"""What the syncer admits: exact layouts, plausible numbers, and merged results it may publish."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from builders import small_syncer, update_for
from ddctl_agents.core.admission import (
    UpdateLimits,
    admit_merge,
    check_result,
    check_update,
    derive_limits,
)
from ddctl_agents.core.config import SyncerConfig, TrustConfig
from ddctl_agents.core.effects import Record, Send
from ddctl_agents.core.merge import Contribution
from ddctl_agents.errors import ConfigError

LIMITS = UpdateLimits(drift_per_step=0.01, max_steps=100, tokens_per_step=100, param_bound=10.0)


def test_limits_come_from_the_inner_optimiser_and_the_model() -> None:
    initial = {"w": torch.tensor([0.5, -2.0]), "b": torch.zeros(3)}
    limits = derive_limits(lr=1e-3, weight_decay=0.1, tokens_per_step=512, max_steps=40, initial=initial, trust=TrustConfig())
    # 4 (safety) * 1e-3 * (3 (Adam) + 0.1 * 2 (largest |initial|))
    assert limits.drift_per_step == pytest.approx(4 * 1e-3 * 3.2)
    assert (limits.tokens_per_step, limits.max_steps) == (512, 40)
    assert limits.param_bound == pytest.approx(1000 * 2.0)


@pytest.mark.parametrize(("field", "value"), [("max_rejections", -1), ("drift_safety", 0.5), ("result_bound", float("inf"))])
def test_trust_settings_are_validated(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        TrustConfig(**{field: value})  # type: ignore[arg-type]


def expected() -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(2, 3), "b": torch.zeros(4)}


def update(value: float = 0.01, *, shapes: dict[str, tuple[int, ...]] | None = None, **counters: int):  # type: ignore[no-untyped-def]
    s = small_syncer()
    base = update_for(s, "L0", 0)
    shapes = shapes or {"w": (2, 3), "b": (4,)}
    return dataclasses.replace(
        base,
        tensors={name: torch.full(shape, value) for name, shape in shapes.items()},
        **{"step": 8, "c_steps": 4, "c_tokens": 400, **counters},
    )


def test_a_plausible_update_is_admitted() -> None:
    assert check_update(update(0.039), expected(), LIMITS) is None  # under 4 steps * 0.01


@pytest.mark.parametrize(
    ("make", "code", "words"),
    [
        (lambda: update(2e38), "out_of_bounds", "moves a parameter by 2e+38"),
        (lambda: update(0.041), "out_of_bounds", "at most 0.04"),
        (lambda: update(float("nan")), "non_finite", "NaN"),
        (lambda: update(float("-inf")), "non_finite", "NaN or Inf"),
        (lambda: update(shapes={"w": (3, 2), "b": (4,)}), "bad_update", "(3, 2)"),
        (lambda: update(shapes={"w": (6,), "b": (4,)}), "bad_update", "float32 (2, 3)"),
        (lambda: update(shapes={"w": (2, 3)}), "bad_update", "holds"),
        (lambda: update(c_steps=9, step=8), "out_of_bounds", "c_steps 9"),
        (lambda: update(c_steps=101, step=500), "out_of_bounds", "at most 100"),
        (lambda: update(c_tokens=401, c_steps=4), "out_of_bounds", "100 tokens per step"),
        (lambda: update(c_tokens=0), "bad_update", ">= 1"),
    ],
)
def test_what_no_learner_could_have_sent_is_refused_with_its_reason(make, code, words) -> None:  # type: ignore[no-untyped-def]
    rejection = check_update(make(), expected(), LIMITS)
    assert rejection is not None and rejection.code == code and words in rejection.reason, rejection


def test_the_dtype_must_be_float32() -> None:
    u = update()
    wrong = dataclasses.replace(u, tensors={**u.tensors, "b": torch.zeros(4, dtype=torch.float64)})
    rejection = check_update(wrong, expected(), LIMITS)
    assert rejection is not None and "torch.float64" in rejection.reason


def test_a_result_must_be_finite_and_bounded() -> None:
    assert check_result({"w": torch.ones(3)}, {"w": torch.ones(3)}, LIMITS) is None
    assert "NaN or Inf" in str(check_result({"w": torch.tensor([1.0, float("inf")])}, {}, LIMITS))
    assert "beyond the bound 10" in str(check_result({"w": torch.ones(3)}, {"w": torch.full((3,), 11.0)}, LIMITS))


def contribution(learner: str, value: float) -> Contribution:
    return Contribution(learner=learner, tensors={"w": torch.full((3,), value)}, c_steps=1, c_tokens=1)


def mean_of(cs) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    """A stand-in outer step: the new value is the sum of what arrived."""
    total = sum((c.tensors["w"] for c in cs), torch.zeros(3))
    return {"w": total}, {}


def test_a_poisoned_contribution_is_found_and_the_round_recomputed_from_the_rest() -> None:
    outcome = admit_merge([contribution("a", 1.0), contribution("bad", 50.0), contribution("c", 2.0)], mean_of, LIMITS)
    assert [c.learner for c in outcome.kept] == ["a", "c"]
    assert [c.learner for c, _ in outcome.culprits] == ["bad"] and "beyond the bound" in outcome.culprits[0][1]
    assert outcome.result is not None and torch.equal(outcome.result[0]["w"], torch.full((3,), 3.0))


def test_harm_done_only_together_drops_the_largest_until_the_rest_pass() -> None:
    outcome = admit_merge([contribution("a", 6.0), contribution("b", 7.0), contribution("c", 1.0)], mean_of, LIMITS)
    assert [c.learner for c in outcome.kept] == ["a", "c"] and [c.learner for c, _ in outcome.culprits] == ["b"]
    assert "together with the others" in outcome.culprits[0][1]


def test_nothing_left_means_no_result() -> None:
    outcome = admit_merge([contribution("x", 20.0), contribution("y", float("nan"))], mean_of, LIMITS)
    assert outcome.kept == [] and outcome.result is None and len(outcome.culprits) == 2


def test_a_round_whose_result_would_overflow_keeps_the_fragment_and_sets_the_culprit_aside() -> None:
    # the update bound lets 5.0 through (5 < 4 steps * 2.0), the result bound (1.0) does not
    s = small_syncer(trust=TrustConfig(max_rejections=2))
    s.limits = UpdateLimits(drift_per_step=2.0, param_bound=1.0)
    for m in ("L0", "L1"):
        s.register(0.0, m)
    before = {k: v.clone() for k, v in s.fragments[0].items()}
    ack, _ = s.receive(1.0, update_for(s, "L1", 0, value=5.0))
    assert ack.status == "accepted"
    effects = s.poll(1.0)
    rnd = next(e.entry for e in effects if isinstance(e, Record) and e.entry["type"] == "round")
    assert rnd["admitted"] == [] and rnd["rejected"] == ["L1"] and s.versions[0] == 0
    assert not any(isinstance(e, Send) for e in effects)
    assert all(torch.equal(before[k], v) for k, v in s.fragments[0].items())
    assert s.ledger.rejected == 400 and s.ledger.balanced() and s.ledger.pending == 0
    assert s.quarantine.standings["L1"].rejections == 1
    # the next round, with a good contribution beside a bad one, publishes the good one alone
    s.receive(2.0, update_for(s, "L0", 0, value=0.1))
    s.receive(2.0, update_for(s, "L1", 0, value=5.0))
    effects = s.poll(2.0)
    rnd = next(e.entry for e in effects if isinstance(e, Record) and e.entry["type"] == "round")
    assert [a["learner"] for a in rnd["admitted"]] == ["L0"] and rnd["rejected"] == ["L1"] and s.versions[0] == 1
    assert s.ledger.merged == 400 and s.ledger.rejected == 800 and s.ledger.balanced()
    assert "L1" not in s.live and s.quarantine.suspension("L1") is not None  # second rejection: suspended
    assert any(isinstance(e, Record) and e.entry["type"] == "suspend" for e in effects)


def test_config_carries_the_trust_settings() -> None:
    assert SyncerConfig().trust == TrustConfig()

from __future__ import annotations

import math

import pytest
import torch

from ddctl_agents.core.merge import (
    PREMISE_MARGIN,
    Contribution,
    MergeError,
    merge_fragment,
    merge_tensor,
    premise_checked_rda,
    radial_directional_average,
    token_weight,
    weighted_mean,
)


def test_token_weight_is_tokens_times_tokens_per_step() -> None:
    assert token_weight(c_tokens=1000, c_steps=10) == 1000 * 100
    assert token_weight(c_tokens=500, c_steps=10) == 500 * 50  # half the data at the same pace: a quarter
    assert token_weight(c_tokens=0, c_steps=5) == 0.0
    assert token_weight(c_tokens=10, c_steps=0) == 0.0  # absent learner weighs nothing


def test_rda_keeps_the_norm_as_learners_grow_while_the_mean_shrinks() -> None:
    gen = torch.Generator().manual_seed(0)
    dim = 20_000
    rda_norms, mean_norms = [], []
    for m in (2, 4, 8, 16):
        vectors = [torch.randn(dim, generator=gen) for _ in range(m)]  # nearly orthogonal in high dimension
        weights = [1.0] * m
        rda_norms.append(float(radial_directional_average(vectors, weights).norm()))
        mean_norms.append(float(weighted_mean(vectors, weights).norm()))
    expected = math.sqrt(dim)
    assert all(abs(n / expected - 1) < 0.02 for n in rda_norms)
    assert mean_norms[-1] / mean_norms[0] == pytest.approx(math.sqrt(2 / 16), rel=0.05)


def test_rda_of_identical_vectors_is_that_vector() -> None:
    v = torch.tensor([3.0, -4.0])
    assert torch.allclose(radial_directional_average([v, v, v], [1.0, 2.0, 3.0]), v)


def test_rda_direction_follows_weights() -> None:
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 10.0])
    out = radial_directional_average([a, b], [3.0, 1.0])
    radius = (3 * 1 + 1 * 10) / 4
    direction = torch.tensor([0.75, 0.25]) / math.hypot(0.75, 0.25)
    assert torch.allclose(out, radius * direction)


def test_degenerate_direction_falls_back_to_the_weighted_mean() -> None:
    v = torch.tensor([1.0, 2.0])
    out = radial_directional_average([v, -v], [1.0, 1.0])
    assert torch.equal(out, torch.zeros(2))
    lopsided = radial_directional_average([v, -2 * v], [1.0, 1.0])  # directions cancel, magnitudes do not
    assert torch.allclose(lopsided, -0.5 * v)


def test_zero_vectors_are_handled() -> None:
    z = torch.zeros(3)
    v = torch.tensor([0.0, 0.0, 2.0])
    assert torch.allclose(radial_directional_average([z, v], [1.0, 1.0]), torch.tensor([0.0, 0.0, 1.0]))


def test_embeddings_always_use_the_plain_mean() -> None:
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert torch.allclose(merge_tensor([a, b], [1, 1], is_embedding=True), torch.tensor([0.5, 0.5]))
    rda = merge_tensor([a, b], [1, 1], is_embedding=False)
    assert float(rda.norm()) == pytest.approx(1.0)


def signal_plus_noise(m: int, noise: float, seed: int = 0, dim: int = 20_000) -> list[torch.Tensor]:
    """M updates sharing one direction plus independent noise of ``noise`` times its norm."""
    gen = torch.Generator().manual_seed(seed)
    signal = torch.randn(dim, generator=gen)
    return [signal + noise * torch.randn(dim, generator=gen) for _ in range(m)]


def alignment(vectors: list[torch.Tensor]) -> float:
    return float(weighted_mean(vectors, [1.0] * len(vectors)).norm()) / (sum(float(v.norm()) for v in vectors) / len(vectors))


@pytest.mark.parametrize("m", [2, 4, 8])
def test_rda_is_used_where_its_premise_holds(m: int) -> None:
    vectors = signal_plus_noise(m, noise=20.0)  # noise dominates: nearly orthogonal
    assert alignment(vectors) < 1 / math.sqrt(m) + 0.05
    merged = merge_tensor(vectors, [1.0] * m, is_embedding=False)
    assert torch.equal(merged, radial_directional_average(vectors, [1.0] * m))
    assert float(merged.norm()) == pytest.approx(sum(float(v.norm()) for v in vectors) / m, rel=1e-5)


@pytest.mark.parametrize("m", [2, 4, 8])
def test_aligned_updates_take_the_plain_mean_rda_would_scale_up(m: int) -> None:
    vectors = signal_plus_noise(m, noise=0.8)  # what learners at H = 24 looked like: 0.65-0.92 of the norm kept
    kept = alignment(vectors)
    orthogonal = 1 / math.sqrt(m)
    assert kept > orthogonal + PREMISE_MARGIN * (1 - orthogonal)
    mean = weighted_mean(vectors, [1.0] * m)
    assert torch.equal(merge_tensor(vectors, [1.0] * m, is_embedding=False), mean)
    gain = float(radial_directional_average(vectors, [1.0] * m).norm()) / float(mean.norm())
    assert gain == pytest.approx(1 / kept, rel=1e-4) and gain > 1.1  # what the check avoids


def test_the_premise_threshold_sits_between_orthogonal_and_parallel() -> None:
    # two unit vectors at angle theta keep cos(theta/2) of their norm; orthogonal keeps 1/sqrt(2)
    threshold = 1 / math.sqrt(2) + PREMISE_MARGIN * (1 - 1 / math.sqrt(2))
    for cosine, rda in ((2 * (threshold - 0.001) ** 2 - 1, True), (2 * (threshold + 0.001) ** 2 - 1, False)):
        a, b = torch.tensor([1.0, 0.0]), torch.tensor([cosine, math.sqrt(1 - cosine**2)])
        merged = premise_checked_rda([a, b], [1.0, 1.0])
        expected = radial_directional_average([a, b], [1.0, 1.0]) if rda else weighted_mean([a, b], [1.0, 1.0])
        assert torch.equal(merged, expected), cosine


def test_merge_fragment_weights_by_tokens_and_is_order_independent() -> None:
    c1 = Contribution(learner="L0", tensors={"w": torch.tensor([1.0, 0.0])}, c_steps=10, c_tokens=100)
    c2 = Contribution(learner="L1", tensors={"w": torch.tensor([0.0, 1.0])}, c_steps=10, c_tokens=200)
    a = merge_fragment([c1, c2], frozenset(), "mean")
    b = merge_fragment([c2, c1], frozenset(), "mean")
    assert torch.equal(a["w"], b["w"])
    assert torch.allclose(a["w"], torch.tensor([1000.0, 4000.0]) / 5000.0)


@pytest.mark.parametrize(
    ("vectors", "weights", "message"),
    [
        ([], [], "at least one vector"),
        ([torch.zeros(2), torch.zeros(3)], [1, 1], "shapes differ"),
        ([torch.zeros(2)], [-1.0], "weights must be >= 0"),
        ([torch.zeros(2)], [0.0], "at least one weight must be positive"),
    ],
)
def test_inconsistent_inputs_raise(vectors: list[torch.Tensor], weights: list[float], message: str) -> None:
    with pytest.raises(MergeError, match=message):
        weighted_mean(vectors, weights)


def test_unknown_merge_method_names_the_allowed_ones() -> None:
    with pytest.raises(MergeError, match="allowed: rda, mean"):
        merge_tensor([torch.zeros(1)], [1.0], is_embedding=False, method="median")

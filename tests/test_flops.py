"""FLOPs per token against the model's real weights, and the peak table's matching order."""

from __future__ import annotations

import pytest
from torch import nn

from ddctl_agents.train.config import ModelConfig
from ddctl_agents.train.flops import flops_per_token, mfu, peak_flops, utilisation
from ddctl_agents.train.model import MoE, build_model

DENSE = ModelConfig(vocab_size=256, seq_len=32, d_model=48, n_layer=3, n_head=4, mlp_ratio=4)
UNTIED = ModelConfig(vocab_size=256, seq_len=32, d_model=48, n_layer=3, n_head=4, tie_embeddings=False)
MOE = ModelConfig(vocab_size=256, seq_len=32, d_model=48, n_layer=3, n_head=4, mlp_ratio=2, n_experts=4, top_k=2)


def counted_flops(config: ModelConfig) -> int:
    """6 x the Linear weights and biases a token goes through (top_k experts of n, the router), the tied
    head, plus attention's 12 x layers x d_model x seq_len: counted on the built model, not from the formula."""
    model = build_model(config, seed=0)
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    in_moe = {id(inner) for moe in moes for inner in moe.modules()}
    weights = sum(
        sum(p.numel() for p in m.parameters()) for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in in_moe
    )
    for moe in moes:
        weights += moe.router.weight.numel() + config.top_k * sum(p.numel() for p in moe.experts[0].parameters())
    if config.tie_embeddings:
        weights += config.d_model * config.vocab_size
    return 6 * weights + 12 * config.n_layer * config.d_model * config.seq_len


@pytest.mark.parametrize("config", [DENSE, UNTIED, MOE], ids=["dense", "untied-head", "moe"])
def test_flops_per_token_counts_the_models_linear_weights(config: ModelConfig) -> None:
    assert flops_per_token(config) == counted_flops(config)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312e12),  # not A10's 125e12, although "A100" contains "A10"
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L40S", 362e12),  # not L4's
        ("nvidia-l4", 121e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("nvidia-h100-80gb", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A10G", 70e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA B200", 2250e12),
        ("cpu", None),
        ("", None),
        ("Some Future Chip 9000", None),
    ],
)
def test_peak_flops_matches_the_most_specific_name(name: str, peak: float | None) -> None:
    assert peak_flops(name) == peak


def test_mfu_is_model_flops_over_the_learners_devices_peak() -> None:
    tokens_per_s = 2e6
    expected = tokens_per_s * flops_per_token(DENSE) / (989e12 * 8)
    assert mfu(tokens_per_s, DENSE, "NVIDIA H100 80GB HBM3", 8) == pytest.approx(expected, rel=1e-12)
    assert mfu(tokens_per_s, DENSE, "NVIDIA H100 80GB HBM3", 1) == pytest.approx(8 * expected, rel=1e-12)
    assert utilisation(tokens_per_s * flops_per_token(DENSE), "NVIDIA H100 80GB HBM3", 8) == pytest.approx(expected)
    assert mfu(tokens_per_s, DENSE, "cpu", 1) is None
    assert mfu(tokens_per_s, DENSE, "NVIDIA H100 80GB HBM3", 0) is None
    assert mfu(-1.0, DENSE, "NVIDIA H100 80GB HBM3", 1) is None

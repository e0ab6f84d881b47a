"""The byte-level GPT: config validation, shapes, causality, init, MoE routing, presets."""

from __future__ import annotations

import math

import pytest
import torch

from ddctl_agents.train.config import ConfigError, ModelConfig
from ddctl_agents.train.model import GPT, MoE, build_model, count_parameters, embedding_names
from ddctl_agents.train.presets import PRESETS, get_preset

SMALL = ModelConfig(seq_len=16, d_model=32, n_layer=2, n_head=4)
SMALL_MOE = ModelConfig(seq_len=16, d_model=32, n_layer=2, n_head=4, n_experts=4, top_k=2)


def byte_batch(batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"n_head": 3}, "n_head"),
        ({"n_layer": 0}, "n_layer"),
        ({"n_experts": 1}, "n_experts"),
        ({"n_experts": 4, "top_k": 5}, "top_k"),
        ({"aux_loss_coef": -1.0}, "aux_loss_coef"),
        ({"vocab_size": 1}, "vocab_size"),
    ],
)
def test_config_names_the_bad_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        ModelConfig(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("config", [SMALL, SMALL_MOE], ids=["dense", "moe"])
def test_forward_shapes_and_untrained_loss(config: ModelConfig) -> None:
    model = build_model(config, seed=0)
    idx, targets = byte_batch(3, 16), byte_batch(3, 16, seed=1)
    out = model(idx)
    assert out.logits.shape == (3, 16, 256)
    assert out.loss is None and out.ce is None
    out = model(idx, targets)
    assert out.ce is not None and out.loss is not None
    assert abs(out.ce.item() - math.log(256)) < 0.05  # small init: near-uniform predictions
    assert torch.allclose(out.loss, out.ce + config.aux_loss_coef * out.aux)


def test_dense_model_has_no_aux_loss() -> None:
    out = build_model(SMALL, seed=0)(byte_batch(2, 8), byte_batch(2, 8, seed=1))
    assert out.aux.item() == 0.0
    assert out.loss is not None and out.ce is not None and out.loss.item() == out.ce.item()


def test_longer_than_context_is_rejected() -> None:
    with pytest.raises(ValueError, match="seq_len=16"):
        build_model(SMALL, seed=0)(byte_batch(1, 17))


@pytest.mark.parametrize("config", [SMALL, SMALL_MOE], ids=["dense", "moe"])
def test_changing_a_future_token_leaves_earlier_logits_alone(config: ModelConfig) -> None:
    model = build_model(config, seed=0)
    idx = byte_batch(2, 16)
    changed = idx.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    before, after = model(idx).logits, model(changed).logits
    assert torch.allclose(before[:, :10], after[:, :10], atol=1e-6)
    assert not torch.allclose(before[:, 10:], after[:, 10:], atol=1e-3)


def test_build_model_is_deterministic_and_leaves_global_rng_alone() -> None:
    rng = torch.get_rng_state()
    a, b, c = build_model(SMALL, seed=7), build_model(SMALL, seed=7), build_model(SMALL, seed=8)
    assert torch.equal(rng, torch.get_rng_state())
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if pa.ndim >= 2:
            assert not torch.equal(pa, pc), name


def test_init_scales_residual_projections() -> None:
    config = ModelConfig(seq_len=16, d_model=128, n_layer=8, n_head=4)
    model = build_model(config, seed=0)
    params = dict(model.named_parameters())
    assert params["blocks.0.attn.qkv.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    residual = 0.02 / math.sqrt(2 * config.n_layer)
    assert params["blocks.3.ffn.proj.weight"].std().item() == pytest.approx(residual, rel=0.05)
    assert torch.equal(params["blocks.0.ln_1.weight"], torch.ones(128))
    assert torch.equal(params["blocks.0.attn.qkv.bias"], torch.zeros(3 * 128))


def test_moe_routes_each_token_to_top_k_distinct_experts() -> None:
    moe = build_model(SMALL_MOE, seed=0).blocks[0].ffn
    assert isinstance(moe, MoE)
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(0))
    routing = moe.route(x)
    assert routing.experts.shape == routing.weights.shape == (40, 2)
    assert all(len(set(row.tolist())) == 2 for row in routing.experts)
    assert torch.allclose(routing.weights.sum(dim=1), torch.ones(40))
    assert torch.equal(routing.experts, routing.probs.topk(2, dim=1).indices)
    out, aux = moe(x)
    expected = torch.stack(
        [
            sum(w * moe.experts[int(e)](token) for w, e in zip(weights, experts, strict=True))
            for token, weights, experts in zip(x, routing.weights, routing.experts, strict=True)
        ]
    )
    assert torch.allclose(out, expected, atol=1e-5)
    assert aux.item() > 0


def test_balance_loss_is_one_when_balanced_and_e_when_collapsed() -> None:
    moe = build_model(SMALL_MOE, seed=0).blocks[0].ffn
    assert isinstance(moe, MoE)
    uniform = torch.full((8, 4), 0.25)
    assert moe.balance_loss(torch.tensor([4, 4, 4, 4]), uniform).item() == pytest.approx(1.0)
    collapsed = torch.zeros(8, 4)
    collapsed[:, 0] = 1.0
    assert moe.balance_loss(torch.tensor([16, 0, 0, 0]), collapsed).item() == pytest.approx(4.0)


def test_every_expert_gets_a_gradient_even_when_unused() -> None:
    moe = build_model(SMALL_MOE, seed=0).blocks[0].ffn
    assert isinstance(moe, MoE)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0
        moe.router.weight[1] = 0.5
    out, aux = moe(torch.ones(6, 32))
    (out.sum() + aux).backward()
    grads = [expert.fc.weight.grad for expert in moe.experts]
    assert all(g is not None for g in grads)  # DDP needs every parameter in the graph
    assert [bool(g.abs().sum() > 0) for g in grads if g is not None] == [True, True, False, False]


def test_embedding_names_tied_and_untied() -> None:
    tied = build_model(SMALL, seed=0)
    names = {name for name, _ in tied.named_parameters()}
    assert embedding_names(tied) == {"wte.weight", "wpe.weight"} <= names
    assert "lm_head.weight" not in names
    untied_config = ModelConfig(seq_len=16, d_model=32, n_layer=2, n_head=4, tie_embeddings=False)
    untied = build_model(untied_config, seed=0)
    assert "lm_head.weight" in dict(untied.named_parameters())
    assert count_parameters(untied) == count_parameters(tied) + 256 * 32


def test_presets() -> None:
    with torch.device("meta"):
        tiny = count_parameters(GPT(get_preset("tiny")))
        moe = count_parameters(GPT(get_preset("tiny-moe")))
        large = count_parameters(GPT(get_preset("large")))
    assert 800_000 <= tiny <= 1_200_000
    assert moe > tiny and get_preset("tiny-moe").n_experts == 4
    assert 0.8e9 <= large <= 1.2e9
    assert {"tiny", "tiny-moe", "small", "base", "large"} <= set(PRESETS)
    with pytest.raises(ConfigError, match="tiny-moe"):
        get_preset("huge")

"""The Hugging Face export: transformers loads the directory and computes our logits; what cannot map is refused."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from ddctl.errors import DdctlError
from ddctl.export.hf import hf_config, hf_state_dict, write_hf
from ddctl_agents.train.config import ModelConfig
from ddctl_agents.train.model import GPT, build_model

SMALL = ModelConfig(seq_len=24, d_model=48, n_layer=3, n_head=4, mlp_ratio=3)
TOLERANCE = 1e-5
"""Largest allowed |logit difference| in float32; a tanh GELU instead of erf is ~1e-3 off."""


@pytest.fixture
def transformers(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """transformers (a test dependency: missing, this fails rather than skips), imported offline (huggingface_hub
    reads HF_HUB_OFFLINE once, at import)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return importlib.import_module("transformers")


def trained_like(config: ModelConfig, seed: int = 0) -> GPT:
    """A model moved well away from init, so biases, LayerNorm gains and the untied head all matter."""
    model = build_model(config, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    return model.eval()


def load(transformers: ModuleType, path: Path, **options: str) -> Any:
    """The exported directory as transformers reads it (a GPT2LMHeadModel), from disk only, in eval mode."""
    return transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **options).eval()


def logits_gap(model: GPT, hf: Any) -> float:
    """Max |our logits - transformers' logits| over random full-length byte sequences."""
    idx = torch.randint(0, model.config.vocab_size, (3, model.config.seq_len), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return float((model(idx).logits - hf(idx).logits).abs().max())


@pytest.mark.parametrize("attention", [{}, {"attn_implementation": "eager"}], ids=["default", "eager"])
@pytest.mark.parametrize("tie", [True, False])
def test_transformers_computes_our_logits(transformers: ModuleType, tmp_path: Path, tie: bool, attention: dict[str, str]) -> None:
    """The default attention is sdpa where transformers has it (>= 4.41), eager before."""
    config = ModelConfig(seq_len=24, d_model=48, n_layer=3, n_head=4, mlp_ratio=3, tie_embeddings=tie)
    model = trained_like(config)
    write_hf(dict(model.named_parameters()), config, tmp_path)
    hf = load(transformers, tmp_path, **attention)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert hf.config.tie_word_embeddings is tie  # transformers >= 5 unties a differing head whatever config says
    assert (hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()) is tie
    assert logits_gap(model, hf) < TOLERANCE


def test_the_comparison_would_catch_the_tanh_gelu(transformers: ModuleType, tmp_path: Path) -> None:
    """The tolerance and the perturbation are tight enough to tell "gelu" from GPT-2's default "gelu_new"."""
    model = trained_like(SMALL)
    write_hf(dict(model.named_parameters()), SMALL, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "activation_function": "gelu_new"}))
    assert logits_gap(model, load(transformers, tmp_path)) > 100 * TOLERANCE


def test_config_json_carries_the_model_configs_numbers(tmp_path: Path) -> None:
    model = trained_like(SMALL)
    written = json.loads((write_hf(dict(model.named_parameters()), SMALL, tmp_path) / "config.json").read_text())
    assert written == {**hf_config(SMALL), "torch_dtype": "float32"}
    assert (written["model_type"], written["architectures"]) == ("gpt2", ["GPT2LMHeadModel"])
    assert (written["vocab_size"], written["n_positions"], written["n_embd"]) == (SMALL.vocab_size, SMALL.seq_len, SMALL.d_model)
    assert (written["n_layer"], written["n_head"], written["n_inner"]) == (SMALL.n_layer, SMALL.n_head, 3 * SMALL.d_model)
    assert written["tie_word_embeddings"] is True
    assert hf_config(ModelConfig(tie_embeddings=False))["tie_word_embeddings"] is False
    assert written["activation_function"] == "gelu"
    assert {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)} == {written["layer_norm_epsilon"]}
    assert written["resid_pdrop"] == written["embd_pdrop"] == written["attn_pdrop"] == 0.0
    assert written["bos_token_id"] is None and written["eos_token_id"] is None


def test_linear_weights_are_transposed_copies_the_model_cannot_change() -> None:
    model = trained_like(SMALL)
    params = dict(model.named_parameters())
    exported = hf_state_dict(params, SMALL)
    qkv = exported["transformer.h.1.attn.c_attn.weight"]
    assert torch.equal(qkv, params["blocks.1.attn.qkv.weight"].T) and qkv.is_contiguous()
    assert torch.equal(exported["transformer.h.2.mlp.c_proj.weight"], params["blocks.2.ffn.proj.weight"].T)
    assert "lm_head.weight" not in exported  # tied: written once, as the token embedding
    before = exported["transformer.wte.weight"].clone()
    with torch.no_grad():
        params["wte.weight"].add_(1.0)
    assert torch.equal(exported["transformer.wte.weight"], before)


def test_a_mixture_of_experts_model_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    config = ModelConfig(seq_len=16, d_model=32, n_layer=2, n_head=4, n_experts=4, top_k=2)
    params = dict(build_model(config, seed=0).named_parameters())
    with pytest.raises(DdctlError, match=r"mixture-of-experts.*n_experts=4.*only dense models \(n_experts=0\)"):
        write_hf(params, config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_parameters_of_another_shape_of_model_are_refused(tmp_path: Path) -> None:
    tied = dict(trained_like(SMALL).named_parameters())
    untied = ModelConfig(seq_len=24, d_model=48, n_layer=3, n_head=4, mlp_ratio=3, tie_embeddings=False)
    with pytest.raises(DdctlError, match=r"missing \['lm_head.weight'\]"):
        write_hf(tied, untied, tmp_path)
    longer = ModelConfig(seq_len=32, d_model=48, n_layer=3, n_head=4, mlp_ratio=3)
    with pytest.raises(DdctlError, match=r"wpe.weight is \(24, 48\), expected \(32, 48\)"):
        write_hf(tied, longer, tmp_path)
    assert not list(tmp_path.iterdir())


def test_an_earlier_export_is_not_overwritten(tmp_path: Path) -> None:
    params = dict(trained_like(SMALL).named_parameters())
    write_hf(params, SMALL, tmp_path)
    weights = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="config.json exists"):
        write_hf(dict(trained_like(SMALL, seed=3).named_parameters()), SMALL, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == weights

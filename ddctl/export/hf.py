"""The built-in GPT as a Hugging Face ``GPT2LMHeadModel`` directory: ``config.json`` and ``model.safetensors``.

Our dense model is GPT-2's network exactly: learned token and position
embeddings, pre-LayerNorm blocks (eps 1e-5, with bias), one fused qkv
projection split q|k|v with heads contiguous inside each, attention scaled by
1/sqrt(head_dim), an exact (erf) GELU MLP, biases on every block projection, a
final LayerNorm and a bias-free head, tied or not. So the export only renames
and transposes (GPT-2's ``Conv1D`` stores (in, out) where ``nn.Linear`` stores
(out, in)); ``transformers`` is not needed to write, only to load::

    write_hf(dict(model.named_parameters()), config, Path("export"))
    AutoModelForCausalLM.from_pretrained("export")

Mixture-of-experts models are refused: no Hugging Face architecture has
GPT-2's blocks with our top-k routed GELU experts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ddctl.errors import DdctlError
from ddctl_agents.train.config import ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

LAYER_NORM_EPS = 1e-5
"""nn.LayerNorm's default, which every norm in ddctl_agents.train.model uses."""

_BLOCK = {
    # our name inside blocks.{i}: (GPT-2's inside transformer.h.{i}, stored transposed)
    "ln_1.weight": ("ln_1.weight", False),
    "ln_1.bias": ("ln_1.bias", False),
    "attn.qkv.weight": ("attn.c_attn.weight", True),
    "attn.qkv.bias": ("attn.c_attn.bias", False),
    "attn.proj.weight": ("attn.c_proj.weight", True),
    "attn.proj.bias": ("attn.c_proj.bias", False),
    "ln_2.weight": ("ln_2.weight", False),
    "ln_2.bias": ("ln_2.bias", False),
    "ffn.fc.weight": ("mlp.c_fc.weight", True),
    "ffn.fc.bias": ("mlp.c_fc.bias", False),
    "ffn.proj.weight": ("mlp.c_proj.weight", True),
    "ffn.proj.bias": ("mlp.c_proj.bias", False),
}
"""One block's parameters; transposed entries are nn.Linear weights that GPT-2 keeps as Conv1D."""


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """config.json for GPT2LMHeadModel computing exactly what GPT(config) computes.

    Every setting that changes the math is written out rather than left to
    GPT-2's defaults (which are the tanh GELU, dropout 0.1 and token ids beyond
    a byte vocabulary), so the file means the same to any transformers version.
    """
    check_exportable(config)
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": config.vocab_size,
        "n_positions": config.seq_len,
        "n_embd": config.d_model,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": config.mlp_ratio * config.d_model,
        "activation_function": "gelu",  # F.gelu's exact erf form; "gelu_new" is the tanh approximation
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "scale_attn_weights": True,  # 1/sqrt(head_dim), as scaled_dot_product_attention
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": 0.02,
        "bos_token_id": None,  # raw bytes: no reserved tokens
        "eos_token_id": None,
        "pad_token_id": None,
        "use_cache": True,
    }


def hf_state_dict(params: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """GPT's parameters (names as ``named_parameters()``) under GPT2LMHeadModel's names.

    Returned tensors are contiguous copies on the input's device, so they share
    no storage (safetensors refuses shared storage) and later training leaves
    them alone. A tied head is written once, as the token embedding, which is
    how transformers saves and re-ties it.
    """
    check_exportable(config)
    expected = _expected_shapes(config)
    missing, unexpected = sorted(expected.keys() - params.keys()), sorted(params.keys() - expected.keys())
    if missing or unexpected:
        raise DdctlError(
            f"parameters do not match the model config (tie_embeddings={config.tie_embeddings}): "
            f"missing {missing or 'none'}, unexpected {unexpected or 'none'}"
        )
    wrong = {name: tuple(params[name].shape) for name, shape in expected.items() if tuple(params[name].shape) != shape}
    if wrong:
        detail = ", ".join(f"{n} is {s}, expected {expected[n]}" for n, s in sorted(wrong.items()))
        raise DdctlError(f"parameter shapes do not match the model config: {detail}")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in params.items():
        hf_name, transpose = _hf_name(name)
        out[hf_name] = _owned(tensor.t() if transpose else tensor)
    return out


def write_hf(params: Mapping[str, torch.Tensor], config: ModelConfig, out: Path) -> Path:
    """Write ``out/config.json`` and ``out/model.safetensors``; returns ``out``.

    Refuses (FileExistsError) to overwrite an earlier export, so a directory
    never mixes two models' files. Weights keep their dtype; config.json says
    which, so transformers loads them as they were trained.
    """
    hf_params = hf_state_dict(params, config)
    config_json = {**hf_config(config), "torch_dtype": _dtype_name(params)}
    try:
        from safetensors.torch import save_file
    except ImportError as exc:
        raise DdctlError("writing Hugging Face weights needs safetensors: pip install 'ddctl[hf]'") from exc
    out = Path(out)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if (out / name).exists():
            raise FileExistsError(f"{out / name} exists; export to a new directory")
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.cpu() for name, t in hf_params.items()}, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config_json, indent=2, sort_keys=True) + "\n")
    return out


def check_exportable(config: ModelConfig) -> None:
    """Raise DdctlError, saying what is supported, for a model no Hugging Face architecture expresses."""
    if config.n_experts:
        raise DdctlError(
            f"cannot export a mixture-of-experts model (n_experts={config.n_experts}, top_k={config.top_k}) "
            "to Hugging Face: no architecture there has GPT-2 blocks with top-k routed GELU experts; "
            "only dense models (n_experts=0) export, as GPT2LMHeadModel"
        )


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of GPT(config) by its name, with its shape."""
    d, hidden = config.d_model, config.mlp_ratio * config.d_model
    block = {
        "ln_1.weight": (d,),
        "ln_1.bias": (d,),
        "attn.qkv.weight": (3 * d, d),
        "attn.qkv.bias": (3 * d,),
        "attn.proj.weight": (d, d),
        "attn.proj.bias": (d,),
        "ln_2.weight": (d,),
        "ln_2.bias": (d,),
        "ffn.fc.weight": (hidden, d),
        "ffn.fc.bias": (hidden,),
        "ffn.proj.weight": (d, hidden),
        "ffn.proj.bias": (d,),
    }
    shapes = {"wte.weight": (config.vocab_size, d), "wpe.weight": (config.seq_len, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    shapes |= {f"blocks.{i}.{name}": shape for i in range(config.n_layer) for name, shape in block.items()}
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    return shapes


def _hf_name(name: str) -> tuple[str, bool]:
    """GPT-2's name for one of our parameters, and whether its weight is stored transposed."""
    if name == "lm_head.weight":
        return name, False
    if not name.startswith("blocks."):
        return f"transformer.{name}", False  # wte, wpe and ln_f keep their names
    _, index, inner = name.split(".", 2)
    hf_inner, transpose = _BLOCK[inner]
    return f"transformer.h.{index}.{hf_inner}", transpose


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy detached from autograd and from the caller's storage."""
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def _dtype_name(params: Mapping[str, torch.Tensor]) -> str:
    """The weights' dtype as config.json spells it ("float32"); mixed dtypes are refused."""
    dtypes = {t.dtype for t in params.values()}
    if len(dtypes) != 1:
        raise DdctlError(f"parameters must share one dtype to export, got {sorted(str(d) for d in dtypes)}")
    return str(next(iter(dtypes))).removeprefix("torch.")


__all__ = ["CONFIG_FILE", "LAYER_NORM_EPS", "WEIGHTS_FILE", "check_exportable", "hf_config", "hf_state_dict", "write_hf"]

"""Model FLOPs per token, accelerators' peak bf16 FLOPs, and model FLOPs utilisation (MFU).

MFU = tokens/s x training FLOPs per token / (devices x the device's dense bf16 peak),
the PaLM paper's definition (appendix B): it counts the model's arithmetic, not
what the hardware happened to execute (no recomputation, no padding).

Training FLOPs per token are 6 x the weights every token passes through in a
matrix multiply (forward 2, backward 4), plus attention's 12 x layers x d_model x
seq_len (scores and values, forward and backward, the common non-causal count).
Embedding lookups cost nothing; a tied output head counts once, as a matmul.
For a mixture-of-experts layer only the top_k experts a token visits count.
A model of your own counts 6 x its parameters (``custom_flops_per_token``).
"""

from __future__ import annotations

from ddctl_agents.train.config import ModelConfig

PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIE", 756e12),
    ("H100", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
)
"""Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, matched in this order
against the device name upper-cased (``torch.cuda.get_device_name``: "NVIDIA H100 80GB HBM3") or a
cloud's accelerator name ("nvidia-h100-80gb"): the more specific names come first, since "A100"
contains "A10" and "L40S" contains "L4". A10G is AWS's data sheet figure for g5."""


def matmul_weights_per_token(config: ModelConfig) -> int:
    """Weights a token passes through in matrix multiplies (one forward pass)."""
    d, hidden = config.d_model, config.mlp_ratio * config.d_model
    attention = 4 * d * d + 4 * d  # qkv and output projections, with biases
    mlp = 2 * d * hidden + hidden + d
    ffn = config.top_k * mlp + d * config.n_experts if config.n_experts else mlp
    return config.n_layer * (attention + ffn) + d * config.vocab_size


def flops_per_token(config: ModelConfig) -> int:
    """Training FLOPs (forward and backward) one token costs at full context."""
    return 6 * matmul_weights_per_token(config) + 12 * config.n_layer * config.d_model * config.seq_len


def custom_flops_per_token(params: int) -> int:
    """A model of your own (``train/contract.py``): 6 x its parameters, Kaplan et al.'s (2020) estimate.

    Its layers are unknown here, so attention's context term is left out and an embedding lookup
    counts as a matmul; the built-in's exact count above does neither."""
    return 6 * params


def peak_flops(accelerator: str) -> float | None:
    """One device's dense bf16 peak, or None for a CPU or an accelerator not in the table."""
    name = accelerator.upper().replace("-", " ")
    for key, peak in PEAK_BF16_FLOPS:
        if key in name:
            return peak
    return None


def mfu(tokens_per_s: float, config: ModelConfig, accelerator: str, devices: int) -> float | None:
    """Model FLOPs utilisation in [0, 1] (above 1 means a wrong report), or None where no peak is known."""
    return utilisation(tokens_per_s * flops_per_token(config), accelerator, devices)


def utilisation(model_flops_per_s: float, accelerator: str, devices: int) -> float | None:
    """``mfu`` from model FLOPs per second, for a caller that keeps ``flops_per_token`` (the syncer, per status)."""
    peak = peak_flops(accelerator)
    if peak is None or devices < 1 or model_flops_per_s < 0:
        return None
    return model_flops_per_s / (peak * devices)


__all__ = [
    "PEAK_BF16_FLOPS",
    "custom_flops_per_token",
    "flops_per_token",
    "matmul_weights_per_token",
    "mfu",
    "peak_flops",
    "utilisation",
]

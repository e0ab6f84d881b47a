"""Named model sizes, from a CI-sized one that trains on a laptop CPU to ~1B for GPUs.

Byte-level vocabulary throughout, so the embedding is small and almost every
parameter sits in the transformer blocks (about 12 * d_model**2 per block).
"""

from __future__ import annotations

from dataclasses import replace

from ddctl_agents.train.config import ConfigError, InnerConfig, ModelConfig

PRESETS: dict[str, ModelConfig] = {
    "micro": ModelConfig(seq_len=128, d_model=64, n_layer=3, n_head=2),
    "mini": ModelConfig(seq_len=128, d_model=96, n_layer=4, n_head=4),
    "tiny": ModelConfig(seq_len=128, d_model=128, n_layer=5, n_head=4),
    "tiny-moe": ModelConfig(seq_len=128, d_model=128, n_layer=5, n_head=4, n_experts=4, top_k=2),
    "small": ModelConfig(seq_len=256, d_model=384, n_layer=6, n_head=6),
    "base": ModelConfig(seq_len=1024, d_model=768, n_layer=18, n_head=12),
    "large": ModelConfig(seq_len=2048, d_model=2048, n_layer=20, n_head=16),
}
"""micro and mini: the CPU rungs below tiny of the scale ladder (``ddctl bench ladder``); tiny ~1.0M
(tests, CPU); tiny-moe its 4-expert top-2 variant; small ~10.7M; base ~128M; large ~1.0B (GPU only)."""


def get_preset(name: str) -> ModelConfig:
    """Look up a preset by name; unknown names fail with the list of allowed ones."""
    try:
        return PRESETS[name]
    except KeyError:
        allowed = ", ".join(sorted(PRESETS))
        raise ConfigError(f"preset must be one of {allowed}; got {name!r}") from None


def model_config(inner: InnerConfig) -> ModelConfig:
    """The model a job trains: its preset, with the vocabulary its data needs when the job names one."""
    preset = get_preset(inner.preset)
    return preset if inner.vocab_size is None else replace(preset, vocab_size=inner.vocab_size)


__all__ = ["PRESETS", "get_preset", "model_config"]

"""The names configs choose from, torch-free, so that a command's --help never imports torch."""

from __future__ import annotations

CODECS: tuple[str, ...] = ("fp32", "bf16", "int8", "int4", "int2", "int1")
"""Outer-gradient codecs (their wire formats: ``core/codec.py``)."""
DEFAULT_BLOCK = 128
"""Values per scale block of the blockwise codecs."""
DOWN_CODECS: tuple[str, ...] = ("bf16", "fp32")
"""Codecs for fragments sent back to learners: they stay near-lossless."""
MERGES: tuple[str, ...] = ("rda", "mean")
"""How contributions are merged: radial-directional averaging, or the plain weighted mean (ablation)."""
STRATEGIES: tuple[str, ...] = ("balanced", "layer", "tensor")
"""Fragmentation: balanced (LPT), or by layer / by tensor (ablations)."""

"""The names configs choose from, torch-free, so that a command's --help never imports torch."""

from __future__ import annotations

CODECS: tuple[str, ...] = ("fp32", "bf16", "int8", "int4", "int2", "int1")
"""Outer-gradient codecs (their wire formats: ``core/codec.py``)."""
DEFAULT_BLOCK = 128
"""Values per scale block of the blockwise codecs."""
MIN_BLOCK, MAX_BLOCK = 8, 4096
"""A block is a multiple of 8 in this range, so that blocks never share a byte (``core/codec.py``)."""


def block_ok(block: object) -> bool:
    """Whether ``block`` is one the codecs take (checked where a job is read, not first at an upload's encode)."""
    return isinstance(block, int) and not isinstance(block, bool) and MIN_BLOCK <= block <= MAX_BLOCK and block % 8 == 0


DELTA = "int8-delta"
"""The down codec that sends each version as an int8 step from the last (``core/version_delta.py``)."""
DOWN_CODECS: tuple[str, ...] = ("bf16", "fp32", DELTA)
"""Codecs for fragments sent back to learners: near-lossless (int8-delta: each version as an int8 step from the last)."""
MERGES: tuple[str, ...] = ("rda", "mean")
"""How contributions are merged: radial-directional averaging, or the plain weighted mean (ablation)."""
LATE_WEIGHTS: tuple[str, ...] = ("period", "staleness")
"""How an update merged behind its fragment's version is weighed: as one period of its tokens (a learner at cadence k
brings k), or that over one plus the versions its base is behind (staleness-aware, as asynchronous SGD's learning
rate over its staleness)."""
STRATEGIES: tuple[str, ...] = ("balanced", "layer", "tensor")
"""Fragmentation: balanced (LPT), or by layer / by tensor (ablations)."""


def wire_codec(down_codec: str) -> str:
    """The codec a down codec's steady-state frames use (what a byte quote counts): a delta's values are int8."""
    return "int8" if down_codec == DELTA else down_codec

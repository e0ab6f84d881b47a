"""The error a checkpoint that cannot be used raises, kept apart from the reader (``checkpoint.py``), which needs
torch, so that an exit-code table (``ddctl.cli.errors``) can name it without importing torch."""

from __future__ import annotations

from ddctl_agents.errors import ConfigError


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used, and why: a damaged or partial file, a manifest out of type or range, tensors
    that are not the model's. Never a half-loaded model. ``ddctl`` reports it as bad input data (exit 3)."""


__all__ = ["CheckpointError"]

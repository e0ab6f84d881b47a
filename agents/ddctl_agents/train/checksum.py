"""A content hash of model parameters, to tell whether two replicas are identical (torch-free to import)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    from torch import Tensor

HEX = frozenset("0123456789abcdef")


def params_sha256(named_tensors: Mapping[str, Tensor]) -> str:
    """sha256 over the tensors in name order, each as contiguous float32 little-endian bytes.

    Names and shapes are not hashed, only values in sorted-name order, so any
    dtype or device of the same values gives the same digest.
    """
    digest = hashlib.sha256()
    for name in sorted(named_tensors):
        array = named_tensors[name].detach().float().contiguous().cpu().numpy()
        digest.update(array.astype("<f4", copy=False).tobytes())
    return digest.hexdigest()


def is_sha256(text: object) -> TypeGuard[str]:
    """A sha256 as ``hexdigest`` writes it: 64 lowercase hex digits (what a file or a peer says before it is used)."""
    return isinstance(text, str) and len(text) == 64 and set(text) <= HEX


__all__ = ["is_sha256", "params_sha256"]

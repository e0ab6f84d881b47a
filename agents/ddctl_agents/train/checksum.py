"""A content hash of model parameters, to tell whether two replicas are identical."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from torch import Tensor


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


__all__ = ["params_sha256"]

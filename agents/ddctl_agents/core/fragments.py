"""Split a model's tensors into P fragments that travel separately.

Balanced tensor fragmentation is greedy number partitioning (LPT): largest
tensor first, each into the currently smallest fragment. Graham's bound keeps
its largest fragment within 4/3 of the best possible, so peak bandwidth is too.
Every tie breaks by name so learners and the syncer derive the same layout from
the model alone. Layer-wise and tensor-wise layouts exist for ablations.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddctl_agents.core.choices import STRATEGIES
from ddctl_agents.errors import FragmentationError

__all__ = ["STRATEGIES", "Fragmentation", "TensorSpec", "fragment_tensors"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """What fragmentation needs to know about one parameter tensor."""

    name: str
    shape: tuple[int, ...]
    is_embedding: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True, kw_only=True)
class Fragmentation:
    """A partition of tensors into fragments; fragment p holds ``fragments[p]``."""

    strategy: str
    fragments: tuple[tuple[TensorSpec, ...], ...]

    @property
    def count(self) -> int:
        return len(self.fragments)

    def sizes(self) -> list[int]:
        """Elements per fragment."""
        return [sum(t.numel for t in frag) for frag in self.fragments]

    def fragment_of(self) -> dict[str, int]:
        """Tensor name -> fragment index."""
        return {t.name: p for p, frag in enumerate(self.fragments) for t in frag}

    def imbalance(self) -> float:
        """Largest fragment over the optimum's lower bound (>= 1; LPT keeps it <= 4/3)."""
        sizes = self.sizes()
        bound = optimal_lower_bound([t for f in self.fragments for t in f], len(sizes))
        return max(sizes) / bound if bound else 1.0


def optimal_lower_bound(tensors: Sequence[TensorSpec], parts: int) -> float:
    """No partition's largest part can be below max(total/parts, largest tensor)."""
    if not tensors:
        return 0.0
    total = sum(t.numel for t in tensors)
    return max(total / parts, max(t.numel for t in tensors))


def fragment_tensors(tensors: Iterable[TensorSpec], parts: int, strategy: str = "balanced") -> Fragmentation:
    """Partition ``tensors`` into ``parts`` non-empty fragments with ``strategy``."""
    specs = sorted(tensors, key=lambda t: t.name)
    if len({t.name for t in specs}) != len(specs):
        raise FragmentationError("tensor names must be unique")
    if strategy not in STRATEGIES:
        raise FragmentationError(f"unknown fragmentation {strategy!r}; allowed: {', '.join(STRATEGIES)}")
    if strategy == "tensor":
        parts = len(specs)
    if not 1 <= parts <= len(specs):
        raise FragmentationError(f"fragments must be in [1, {len(specs)}] (the number of tensors), got {parts}")
    if strategy == "balanced":
        groups = _balanced(specs, parts)
    elif strategy == "layer":
        groups = _layerwise(specs, parts)
    else:
        groups = [[t] for t in specs]
    frags = tuple(tuple(sorted(g, key=lambda t: t.name)) for g in groups)
    return Fragmentation(strategy=strategy, fragments=frags)


def _balanced(specs: list[TensorSpec], parts: int) -> list[list[TensorSpec]]:
    groups: list[list[TensorSpec]] = [[] for _ in range(parts)]
    heap = [(0, p) for p in range(parts)]  # (elements, index): ties go to the lowest index
    for spec in sorted(specs, key=lambda t: (-t.numel, t.name)):
        size, p = heapq.heappop(heap)
        groups[p].append(spec)
        heapq.heappush(heap, (size + spec.numel, p))
    return groups


_LAYER = re.compile(r"(?:^|\.)(?:blocks|layers|h)\.(\d+)\.")


def layer_key(name: str) -> tuple[int, int]:
    """Order tensors as the network does: inputs, then blocks 0..L-1, then outputs."""
    match = _LAYER.search(name)
    if match:
        return (1, int(match.group(1)))
    return (0, 0) if "emb" in name else (2, 0)


def _layerwise(specs: list[TensorSpec], parts: int) -> list[list[TensorSpec]]:
    """Contiguous runs of layers, cut where the running size crosses k/parts of the total."""
    layers: dict[tuple[int, int], list[TensorSpec]] = {}
    for spec in specs:
        layers.setdefault(layer_key(spec.name), []).append(spec)
    ordered = [layers[k] for k in sorted(layers)]
    if parts > len(ordered):
        raise FragmentationError(f"layer fragmentation needs fragments <= {len(ordered)} (layer groups), got {parts}")
    total = sum(t.numel for t in specs)
    groups: list[list[TensorSpec]] = [[] for _ in range(parts)]
    done, p = 0, 0
    for i, layer in enumerate(ordered):
        left_layers, left_parts = len(ordered) - i, parts - p
        if groups[p] and (left_layers < left_parts or done >= total * (p + 1) / parts) and p + 1 < parts:
            p += 1
        groups[p].extend(layer)
        done += sum(t.numel for t in layer)
    return groups

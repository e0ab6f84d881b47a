from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddctl_agents.core.fragments import (
    FragmentationError,
    TensorSpec,
    fragment_tensors,
    layer_key,
    optimal_lower_bound,
)


def specs(sizes: list[int]) -> list[TensorSpec]:
    return [TensorSpec(name=f"t{i:03d}", shape=(s,)) for i, s in enumerate(sizes)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=9), st.integers(1, 4))
def test_balanced_is_within_four_thirds_of_the_optimum(sizes: list[int], parts: int) -> None:
    parts = min(parts, len(sizes))
    frag = fragment_tensors(specs(sizes), parts)
    assert sorted(t.name for f in frag.fragments for t in f) == sorted(s.name for s in specs(sizes))
    assert all(frag.fragments)  # never an empty fragment
    # Graham: LPT <= (4/3 - 1/(3P)) * OPT, against the true optimum found by brute force.
    assert max(frag.sizes()) <= (4 / 3 - 1 / (3 * parts)) * _brute_force(sizes, parts) + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 30))
def test_imbalance_is_reported_against_the_optimums_lower_bound(sizes: list[int], parts: int) -> None:
    parts = min(parts, len(sizes))
    frag = fragment_tensors(specs(sizes), parts)
    assert frag.imbalance() == max(frag.sizes()) / optimal_lower_bound(specs(sizes), parts) >= 1.0


def test_lpt_bound_holds_against_a_brute_force_optimum() -> None:
    sizes = [7, 7, 6, 6, 5, 5, 4, 4, 4]
    frag = fragment_tensors(specs(sizes), 3)
    best = _brute_force(sizes, 3)
    assert max(frag.sizes()) <= 4 / 3 * best
    assert best == 16


def _brute_force(sizes: list[int], parts: int) -> int:
    best = sum(sizes)

    def go(i: int, loads: list[int]) -> None:
        nonlocal best
        if max(loads) >= best:
            return
        if i == len(sizes):
            best = max(loads)
            return
        for p in range(parts):
            loads[p] += sizes[i]
            go(i + 1, loads)
            loads[p] -= sizes[i]

    go(0, [0] * parts)
    return best


def test_ties_break_by_name_so_every_party_derives_the_same_layout() -> None:
    a = fragment_tensors(specs([5, 5, 5, 5]), 2)
    b = fragment_tensors(list(reversed(specs([5, 5, 5, 5]))), 2)
    assert a == b
    assert [[t.name for t in f] for f in a.fragments] == [["t000", "t002"], ["t001", "t003"]]


def test_embedding_flag_travels_with_the_tensor() -> None:
    tensors = [TensorSpec(name="tok_emb.weight", shape=(256, 8), is_embedding=True), TensorSpec(name="b", shape=(3,))]
    frag = fragment_tensors(tensors, 2)
    flagged = [t.name for f in frag.fragments for t in f if t.is_embedding]
    assert flagged == ["tok_emb.weight"]


def test_layerwise_keeps_layers_whole_and_in_network_order() -> None:
    names = ["tok_emb.weight", "blocks.0.a", "blocks.0.b", "blocks.1.a", "blocks.1.b", "blocks.10.a", "ln_f.weight"]
    tensors = [TensorSpec(name=n, shape=(10,)) for n in names]
    frag = fragment_tensors(tensors, 3, "layer")
    layers_per_fragment = [{layer_key(t.name) for t in f} for f in frag.fragments]
    seen: set[tuple[int, int]] = set()
    for layers in layers_per_fragment:
        assert not layers & seen  # a layer never straddles two fragments
        seen |= layers
    order = [min(layer_key(t.name) for t in f) for f in frag.fragments]
    assert order == sorted(order)
    assert layer_key("blocks.10.a") > layer_key("blocks.1.a")


def test_tensorwise_gives_one_fragment_per_tensor() -> None:
    frag = fragment_tensors(specs([1, 2, 3]), 1, "tensor")
    assert frag.count == 3


def test_balanced_beats_layerwise_on_imbalance_for_a_real_shape() -> None:
    tensors = [TensorSpec(name="tok_emb.weight", shape=(256, 128), is_embedding=True)]
    for i in range(4):
        tensors += [
            TensorSpec(name=f"blocks.{i}.qkv", shape=(384, 128)),
            TensorSpec(name=f"blocks.{i}.fc", shape=(512, 128)),
            TensorSpec(name=f"blocks.{i}.ln", shape=(128,)),
        ]
    assert fragment_tensors(tensors, 4).imbalance() < fragment_tensors(tensors, 4, "layer").imbalance()


@pytest.mark.parametrize(
    ("parts", "strategy", "message"),
    [(0, "balanced", "fragments must be in"), (4, "balanced", "fragments must be in"), (2, "bogus", "unknown fragmentation")],
)
def test_impossible_layouts_are_refused_with_the_allowed_range(parts: int, strategy: str, message: str) -> None:
    with pytest.raises(FragmentationError, match=message):
        fragment_tensors(specs([1, 2, 3]), parts, strategy)


def test_layerwise_refuses_more_fragments_than_layers() -> None:
    tensors = [TensorSpec(name=n, shape=(4,)) for n in ["blocks.0.a", "blocks.0.b", "blocks.1.a"]]
    with pytest.raises(FragmentationError, match="layer groups"):
        fragment_tensors(tensors, 3, "layer")

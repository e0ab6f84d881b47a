"""The one-pass merge and step (``packed_combine_step``) against the two passes it replaces.

The mean of a round is formed and stepped in one native pass that never writes it; the
claim is that this gives the same bits as writing the combination (``packed_combine``) and
stepping from it (``step_from``), on the AVX2 body and the portable tail alike, and that the
norms-only combination gives the norms the writing one does.
"""

from __future__ import annotations

import math

import pytest
import torch

from ddctl_agents.core import _native
from ddctl_agents.core.messages import Update, decode_update, encode_update
from ddctl_agents.core.packed import Packed, PackedTensors

pytestmark = pytest.mark.usefixtures("native_kernels")


def _packed(numel: int, updates: int, codec: str, block: int, seed: int) -> list[Packed]:
    gen = torch.Generator().manual_seed(seed)
    found = []
    for m in range(updates):
        tensors = {"w": 1e-3 * torch.randn(numel, generator=gen)}
        update = Update(
            learner=f"L{m}", fragment=0, base_version=0, update_id="u", step=1, c_steps=1, c_tokens=1, tensors=tensors
        )
        decoded = decode_update(encode_update(update, codec, block))[0]
        assert isinstance(decoded.tensors, PackedTensors)
        found.append(decoded.tensors.packed["w"])
    return found


def _addresses(packed: list[Packed]) -> tuple[list[int], list[int]]:
    return [p.scales for p in packed], [p.codes for p in packed]


@pytest.mark.parametrize("codec", ["int4", "int8"])
@pytest.mark.parametrize("block", [8, 64, 72])
@pytest.mark.parametrize("numel", [1000, 2048, 5001])  # no whole tile; whole tiles only; tiles and a tail
@pytest.mark.parametrize(("momentum", "nesterov"), [(None, True), (0.9, True), (0.5, False)])
def test_one_pass_gives_the_bits_of_the_combination_written_then_stepped(
    codec: str, block: int, numel: int, momentum: float | None, nesterov: bool
) -> None:
    packed = _packed(numel, 5, codec, block, seed=numel + block)
    coefficients, scale = [0.3, 0.1, 0.25, 0.2, 0.15], 1.37
    gen = torch.Generator().manual_seed(1)
    theta = torch.randn(numel, generator=gen)
    buf = None if momentum is None else 1e-3 * torch.randn(numel, generator=gen)
    moves = (0.0 if momentum is None else momentum, 0.7, nesterov)
    buf_at = None if buf is None else buf.data_ptr()

    combined, want_theta, want_buf = torch.empty(numel), torch.empty(numel), torch.empty(numel)
    _native.packed_combine(codec, *_addresses(packed), [coefficients], numel, block, [combined.data_ptr()])
    want = _native.step_from(
        combined.data_ptr(), scale, numel, theta.data_ptr(), buf_at, moves, (want_theta.data_ptr(), want_buf.data_ptr())
    )

    got_theta, got_buf = torch.full((numel,), math.nan), torch.full((numel,), math.nan)
    step = (numel, theta.data_ptr(), buf_at, moves, (got_theta.data_ptr(), got_buf.data_ptr()))
    got = _native.packed_combine_step(codec, _addresses(packed), coefficients, block, scale, step)

    assert torch.equal(got_theta, want_theta) and torch.equal(got_buf, want_buf)
    assert got == want == (float(want_theta.abs().max()), float(want_buf.abs().max()))
    assert not torch.equal(got_theta, theta)  # the step moved it


@pytest.mark.parametrize("codec", ["int4", "int8"])
@pytest.mark.parametrize("numel", [1000, 5001])
def test_the_norms_alone_are_the_norms_of_the_combinations_written(codec: str, numel: int) -> None:
    packed = _packed(numel, 4, codec, 64, seed=numel)
    rows = [[0.4, 0.3, 0.2, 0.1], [1.0, -2.0, 0.5, 3.0]]
    outs = [torch.empty(numel), torch.empty(numel)]
    written = _native.packed_combine(codec, *_addresses(packed), rows, numel, 64, [o.data_ptr() for o in outs])
    alone = _native.packed_combine(codec, *_addresses(packed), rows, numel, 64, [])
    assert alone == written
    assert alone == pytest.approx([float(o.double().square().sum()) for o in outs], rel=1e-5)

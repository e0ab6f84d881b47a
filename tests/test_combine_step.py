"""The one-pass merge and step (``packed_combine_step``) against the two passes it replaces.

The mean of a round is formed and stepped in one native pass that never writes it; the
claim is that this gives the same bits as writing the combination (``packed_combine``) and
stepping from it (``step_from``), on the AVX2 body and the portable tail alike, and that the
norms-only combination gives the norms the writing one does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

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


@pytest.fixture
def sums_on() -> Iterator[Callable[[bool], object]]:
    """Switch the int4 sums between AVX-512 and AVX2 (restored after); skipped where the CPU has no AVX-512F, as then
    only the AVX2 sums exist."""
    before = _native.use_avx512(True)
    if before is None:
        pytest.skip("this CPU has no AVX-512F: the AVX2 sums are the only hand-written ones, and run everywhere")
    yield _native.use_avx512
    _native.use_avx512(before)


@pytest.mark.parametrize("numel", [1024, 5127])  # one whole tile; whole tiles and a tail (the portable loop's)
@pytest.mark.parametrize("updates", [1, 3, 8])
def test_the_avx512_sums_give_the_avx2_bits(numel: int, updates: int, sums_on: Callable[[bool], object]) -> None:
    gen = torch.Generator().manual_seed(numel + updates)
    blocks = -(-numel // 64)
    codes = [torch.randint(0, 256, ((numel + 1) // 2,), generator=gen, dtype=torch.uint8) for _ in range(updates)]
    scales = [1e-3 * torch.randn(blocks, generator=gen) for _ in range(updates)]  # raw bytes: every code, -8 too
    packed = ([s.data_ptr() for s in scales], [c.data_ptr() for c in codes])
    rows = [torch.rand(updates, generator=gen).tolist(), torch.randn(updates, generator=gen).tolist()]
    theta, buf = torch.randn(numel, generator=gen), 1e-3 * torch.randn(numel, generator=gen)

    def round_on(wide: bool) -> list[object]:
        sums_on(wide)
        two, one = [torch.full((numel,), math.nan) for _ in range(2)], torch.full((numel,), math.nan)
        norms = _native.packed_combine("int4", *packed, rows, numel, 64, [t.data_ptr() for t in two])
        alone = _native.packed_combine("int4", *packed, rows, numel, 64, [])
        mean = _native.packed_combine("int4", *packed, rows[:1], numel, 64, [one.data_ptr()])
        stepped = [torch.full((numel,), math.nan) for _ in range(2)]
        step = (numel, theta.data_ptr(), buf.data_ptr(), (0.9, 0.7, True), (stepped[0].data_ptr(), stepped[1].data_ptr()))
        largest = _native.packed_combine_step("int4", packed, rows[0], 64, 1.37, step)
        return [*two, one, *stepped, norms, alone, mean, largest]

    wide, narrow = round_on(True), round_on(False)
    for got, want in zip(wide, narrow, strict=True):
        assert torch.equal(got, want) if isinstance(got, torch.Tensor) else got == want
    assert not wide[0].isnan().any() and not wide[3].isnan().any()  # every value written

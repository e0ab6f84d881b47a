"""The fused round (packed updates merged and stepped in one native pass) against the reference path.

The reference is merge.py + outer.py on the decoded tensors; the fused path must make the same
decisions (RDA or the mean, per tensor) and agree to float32 rounding, for every codec it handles,
block size, partial last block, warm-up and momentum state, and it must hand back to the reference
whatever it cannot do exactly.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from builders import small_syncer, update_for
from ddctl_agents.core import _native
from ddctl_agents.core import syncer as syncer_module
from ddctl_agents.core.admission import MeasuredTensors, UpdateLimits, check_result, check_update
from ddctl_agents.core.codec import encode
from ddctl_agents.core.config import OuterConfig
from ddctl_agents.core.fused_round import fused_outer_step
from ddctl_agents.core.merge import Contribution, merge_fragment
from ddctl_agents.core.messages import Update, decode_update, encode_update
from ddctl_agents.core.outer import outer_step
from ddctl_agents.core.packed import Packed, PackedSum, PackedTensors
from ddctl_agents.core.rounds import accumulate

pytestmark = pytest.mark.usefixtures("native_kernels")

SHAPES = {"w": (37, 129), "b": (53,), "emb": (16, 8)}  # odd sizes: partial last blocks, an odd int4 byte


def _update(learner: str, tensors: dict[str, torch.Tensor], c_tokens: int = 1000, c_steps: int = 24) -> Update:
    return Update(
        learner=learner,
        fragment=0,
        base_version=0,
        update_id="u",
        step=c_steps,
        c_steps=c_steps,
        c_tokens=c_tokens,
        tensors=tensors,
    )


def _contributions(
    vectors: list[dict[str, torch.Tensor]], codec: str, block: int, tokens: list[int] | None = None
) -> tuple[list[Contribution], list[Contribution]]:
    """The same learners' updates packed (as the syncer receives them) and decoded (the reference's input)."""
    packed, decoded = [], []
    for m, tensors in enumerate(vectors):
        frame = encode_update(_update(f"L{m}", tensors, c_tokens=(tokens or [1000] * len(vectors))[m]), codec, block)
        update = decode_update(frame)[0]
        assert isinstance(update.tensors, PackedTensors)
        plain = {name: update.tensors.packed[name].decode() for name in update.tensors}
        for target, source in ((packed, update.tensors), (decoded, plain)):
            target.append(Contribution(learner=update.learner, tensors=source, c_steps=update.c_steps, c_tokens=update.c_tokens))
    return packed, decoded


def _random(m: int, seed: int, shared: float = 0.0) -> list[dict[str, torch.Tensor]]:
    """m updates; ``shared`` mixes in a common direction (0: nearly orthogonal, 1: parallel)."""
    gen = torch.Generator().manual_seed(seed)
    common = {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}
    return [
        {k: 1e-3 * (shared * common[k] + (1 - shared) * torch.randn(s, generator=gen)) for k, s in SHAPES.items()}
        for _ in range(m)
    ]


def _reference(params, buffers, contributions, method, config, taken):  # type: ignore[no-untyped-def]
    delta = merge_fragment(contributions, frozenset({"emb"}), method)
    return outer_step(params, delta, buffers, config, taken)


def _state(seed: int, with_buffers: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    params = {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}
    buffers = {k: 1e-3 * torch.randn(s, generator=gen) for k, s in SHAPES.items()} if with_buffers else {}
    return params, buffers


def _checked(packed, decoded, params, buffers, method, config, taken):  # type: ignore[no-untyped-def]
    """The fused round, asserted equal (to rounding) to the reference on the decoded updates; its (params, buffers)."""
    fused = fused_outer_step(params, buffers, packed, embeddings=frozenset({"emb"}), method=method, config=config, taken=taken)
    assert fused is not None
    want = _reference(params, buffers, decoded, method, config, taken)
    _assert_close(fused[0], want[0])
    _assert_close(fused[1], want[1])
    for tensors in fused:  # what the step kept for the result's check is every new tensor's exact max |value|
        assert isinstance(tensors, MeasuredTensors) and set(tensors.largest) == set(tensors)
        assert all(tensors.largest[name] == float(t.abs().max()) for name, t in tensors.items())
    return fused


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == torch.float32
        torch.testing.assert_close(got[name], want[name], rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("codec", ["int4", "int8"])
@pytest.mark.parametrize("block", [8, 64, 72, 4096])
@pytest.mark.parametrize("method", ["rda", "mean"])
def test_fused_round_matches_the_reference(codec: str, block: int, method: str) -> None:
    packed, decoded = _contributions(_random(5, seed=block), codec, block, tokens=[1000, 700, 1300, 400, 1000])
    params, buffers = _state(1, with_buffers=True)
    config = OuterConfig(lr=0.7, momentum=0.5, warmup=3)
    _checked(packed, decoded, params, buffers, method, config, 1)


@pytest.mark.parametrize("m", [1, 2, 8])
@pytest.mark.parametrize("shared", [0.0, 0.5, 1.0])
def test_fused_round_takes_the_references_rda_or_mean_decision(m: int, shared: float) -> None:
    """Orthogonal updates take RDA (the step keeps the learners' norm); aligned ones the mean; both as the reference."""
    packed, decoded = _contributions(_random(m, seed=m, shared=shared), "int4", 64)
    params, _ = _state(2, with_buffers=False)
    fused = _checked(packed, decoded, params, {}, "rda", OuterConfig(lr=1.0, momentum=0.0), 0)
    step = params["w"] - fused[0]["w"]
    mean = sum(c.tensors["w"] for c in decoded) / m
    if m > 1 and shared == 0.0:  # RDA: the merged step is as long as the updates, not ~1/sqrt(m) of it
        assert float(step.norm()) > 0.9 * math.sqrt(m) * float(mean.norm())
    else:
        torch.testing.assert_close(step, mean, rtol=1e-3, atol=5e-7)  # RDA would be 15-33% longer


@pytest.mark.parametrize("where", [0, 4771])  # in the eight-wide body and in the tail of w's 4,773 values
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("method", ["rda", "mean"])  # the step from a written combination, and the one-pass step
def test_the_results_check_sees_a_non_finite_value_the_step_wrote(where: int, bad: float, method: str) -> None:
    """The step keeps NaN where it wrote one (a max would drop it) and Inf as the largest, so the check the round
    runs on its result (no second read) refuses it, as it refuses the same values measured afresh."""
    packed, _ = _contributions(_random(3, seed=11), "int4", 64)
    params, buffers = _state(3, with_buffers=True)
    params["w"].view(-1)[where] = bad
    fused = fused_outer_step(params, buffers, packed, embeddings=frozenset({"emb"}), method=method,
                             config=OuterConfig(lr=0.7, momentum=0.5), taken=4)  # fmt: skip
    assert fused is not None and isinstance(fused[0], MeasuredTensors)
    kept = fused[0].largest["w"]
    assert math.isnan(kept) if math.isnan(bad) else kept == math.inf
    limits = UpdateLimits(drift_per_step=1.0, max_steps=100, tokens_per_step=1.0, param_bound=100.0)
    assert "'w' would become NaN or Inf" in str(check_result(*fused, limits))
    assert check_result(dict(fused[0]), dict(fused[1]), limits) == check_result(*fused, limits)


def test_the_results_check_reads_what_the_step_kept_and_measures_the_rest() -> None:
    limits = UpdateLimits(drift_per_step=1.0, max_steps=100, tokens_per_step=1.0, param_bound=10.0)
    kept = MeasuredTensors({"w": torch.ones(3)}, {"w": 11.0})  # the step's own figure is what counts for w
    assert "beyond the bound 10" in str(check_result(kept, {}, limits))
    partly = MeasuredTensors({"w": torch.ones(3), "b": torch.full((2,), 12.0)}, {"w": 1.0})  # b: measured afresh
    assert "'b' would reach |12|" in str(check_result(partly, {}, limits))


def test_zero_weight_contributions_count_for_nothing_and_momentum_starts_at_the_delta() -> None:
    packed, decoded = _contributions(_random(3, seed=7), "int4", 64)
    packed[1] = dataclasses.replace(packed[1], c_tokens=0)
    decoded[1] = dataclasses.replace(decoded[1], c_tokens=0)
    params, _ = _state(3, with_buffers=False)
    config = OuterConfig(lr=0.7, momentum=0.5)
    fused = _checked(packed, decoded, params, {}, "rda", config, 0)
    without = fused_outer_step(
        params, {}, [packed[0], packed[2]], embeddings=frozenset({"emb"}), method="rda", config=config, taken=0
    )
    assert without is not None
    _assert_close(fused[0], without[0])


def test_a_learners_updates_added_for_one_round_stay_packed_and_read_as_the_eager_sum() -> None:
    packed, decoded = _contributions(_random(3, seed=5), "int4", 64)
    two, three = accumulate(packed[0], packed[1]), accumulate(accumulate(packed[0], packed[1]), packed[2])
    assert isinstance(two.tensors, PackedSum) and isinstance(three.tensors, PackedSum) and len(three.tensors.parts) == 3
    eager = accumulate(accumulate(decoded[0], decoded[1]), decoded[2])  # decoded values: added at once, as before
    assert not isinstance(eager.tensors, PackedSum) and sorted(three.tensors) == sorted(eager.tensors)
    assert all(torch.equal(three.tensors[name], eager.tensors[name]) for name in SHAPES)  # bit for bit
    assert (three.c_steps, three.c_tokens) == (eager.c_steps, eager.c_tokens)
    mixed = accumulate(packed[0], decoded[1])  # one of them decoded (restored from a snapshot): decoded values
    assert not isinstance(mixed.tensors, PackedSum)
    assert all(torch.equal(mixed.tensors[n], decoded[0].tensors[n] + decoded[1].tensors[n]) for n in SHAPES)


@pytest.mark.parametrize("codec", ["int4", "int8"])
@pytest.mark.parametrize("method", ["rda", "mean"])
@pytest.mark.parametrize("shared", [0.0, 1.0])
def test_a_round_with_a_learners_added_updates_stays_fused_and_matches_the_reference(
    codec: str, method: str, shared: float
) -> None:
    """L0's three updates and L1's two are added for the round; L2 sent one. The fused path takes them packed, with
    RDA's norm of each learner's sum, and publishes what the reference does with the added, decoded values."""
    vectors = _random(6, seed=21, shared=shared)
    packed, decoded = _contributions(vectors, codec, 64, tokens=[500, 600, 700, 800, 900, 1000])
    learners = {"L0": [0, 1, 2], "L1": [3, 4], "L2": [5]}

    def added(contributions: list[Contribution]) -> list[Contribution]:
        out = []
        for name, members in learners.items():
            total = None
            for m in members:
                total = accumulate(total, dataclasses.replace(contributions[m], learner=name))
            assert total is not None
            out.append(total)
        return out

    summed_packed, summed_decoded = added(packed), added(decoded)
    assert isinstance(summed_packed[0].tensors, PackedSum) and not isinstance(summed_decoded[0].tensors, PackedSum)
    params, buffers = _state(6, with_buffers=True)
    _checked(summed_packed, summed_decoded, params, buffers, method, OuterConfig(lr=0.7, momentum=0.5), 2)


def test_what_the_fused_path_cannot_do_goes_to_the_reference() -> None:
    packed, decoded = _contributions(_random(2, seed=9), "int4", 64)
    params, _ = _state(4, with_buffers=False)
    kw = {"embeddings": frozenset({"emb"}), "method": "rda", "config": OuterConfig(), "taken": 0}
    restored = accumulate(packed[0], decoded[0])  # one update of the sum restored from a snapshot: decoded values
    assert not isinstance(restored.tensors, PackedSum | PackedTensors)
    assert fused_outer_step(params, {}, [restored, packed[1]], **kw) is None  # type: ignore[arg-type]
    int8, _ = _contributions(_random(1, seed=9), "int8", 64)
    assert fused_outer_step(params, {}, [packed[0], int8[0]], **kw) is None  # type: ignore[arg-type]
    other_block, _ = _contributions(_random(1, seed=9), "int4", 32)
    assert fused_outer_step(params, {}, [packed[0], other_block[0]], **kw) is None  # type: ignore[arg-type]
    assert fused_outer_step({"w": params["w"]}, {}, packed, **kw) is None  # type: ignore[arg-type]
    assert fused_outer_step(params, {}, packed, **{**kw, "method": "median"}) is None  # type: ignore[arg-type]


def test_decode_update_keeps_int4_packed_only_for_immutable_frames_with_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = encode_update(_update("L0", _random(1, seed=1)[0]), "int4", 64)
    assert isinstance(decode_update(frame)[0].tensors, PackedTensors)
    assert isinstance(decode_update(bytearray(frame))[0].tensors, dict)  # a buffer that may change: decoded now
    assert isinstance(decode_update(encode_update(_update("L0", _random(1, seed=1)[0]), "fp32", 64))[0].tensors, dict)
    monkeypatch.setenv(_native.NO_NATIVE_ENV, "1")
    assert isinstance(decode_update(frame)[0].tensors, dict)


def test_packed_tensors_decode_to_what_the_codec_gives_once() -> None:
    tensors = _random(1, seed=5)[0]
    update = decode_update(encode_update(_update("L0", tensors), "int4", 64))[0]
    lazy = update.tensors
    assert isinstance(lazy, PackedTensors) and sorted(lazy) == sorted(tensors) and len(lazy) == 3
    for name, t in tensors.items():
        want = decode_update(bytearray(encode_update(_update("L0", tensors), "int4", 64)))[0].tensors[name]
        assert torch.equal(lazy[name], want) and lazy[name].shape == t.shape
        assert lazy[name] is lazy[name]  # decoded once


def _hostile(codes: bytes, scales: list[float], numel: int, block: int = 8) -> Packed:
    payload = torch.tensor(scales, dtype=torch.float32).numpy().tobytes() + codes
    return Packed("int4", memoryview(payload), (numel,), block)


def test_packed_stats_are_the_decoded_values_exact_max_and_sum_of_squares() -> None:
    x = torch.randn(1001, generator=torch.Generator().manual_seed(0)) * 3e-3
    for codec in ("int4", "int8"):
        p = Packed(codec, memoryview(encode(codec, x, 64)), (1001,), 64)
        values = p.decode()
        squares, largest = p.stats()
        assert largest == float(values.abs().max())  # exact: the admission bound compares it
        assert squares == pytest.approx(float(values.double().pow(2).sum()), rel=1e-6)  # decoded values are rounded to float32
        assert p.norm() == pytest.approx(float(values.double().norm()), rel=1e-6)  # decoded values are rounded to float32


def test_packed_stats_read_codes_an_encoder_never_writes_as_what_they_decode_to() -> None:
    """A learner is not trusted to have used our encoder: nibble -8, negative and non-finite scales."""
    minus_eight = _hostile(bytes([0x88] * 4), [-0.5], 8)  # eight codes of -8 at scale -0.5: +4 each
    assert minus_eight.stats() == (8 * 16.0, 4.0)
    assert float(minus_eight.decode().abs().max()) == 4.0
    gen = torch.Generator().manual_seed(3)
    raw = bytes(torch.randint(0, 256, (32 * 5,), generator=gen, dtype=torch.uint8).tolist())  # every nibble, -8 included
    scales = [0.25, -1.5, 3.0, 1e-3, -0.0]
    noisy = _hostile(raw, scales, 64 * 5, block=64)  # whole blocks of the default size: the AVX2 path where there is one
    values = noisy.decode()
    assert noisy.stats() == (pytest.approx(float(values.double().pow(2).sum()), rel=1e-12), float(values.abs().max()))
    for bad in (math.nan, math.inf):
        squares, largest = _hostile(bytes(4), [bad], 8).stats()  # codes 0: decodes to NaN (0 * inf is NaN)
        assert math.isnan(squares) and math.isnan(largest)


def _stats_block_by_block(codes: bytes, scales: list[float]) -> tuple[float, float]:
    """ddctl_q_stats's definition, a block of 64 at a time in order: sum of float64 s*s*sq, max of float32 |s|*top."""
    nibbles = torch.tensor(list(codes), dtype=torch.int32)
    q = torch.stack([(nibbles & 15) ^ 8, ((nibbles >> 4) & 15) ^ 8], dim=1).reshape(-1, 64) - 8
    squares, largest = 0.0, torch.tensor(0.0)
    for s, block in zip(torch.tensor(scales, dtype=torch.float32), q, strict=True):
        squares += float(s.double()) * float(s.double()) * float(block.square().sum())
        largest = torch.maximum(largest, s.abs() * block.abs().max().float())
    return squares, float(largest)


@pytest.mark.parametrize("blocks", [1, 4, 7, 64])  # four at a time on AVX2, and the blocks left over
def test_packed_stats_over_many_blocks_are_the_block_by_block_figures_bit_for_bit(blocks: int) -> None:
    gen = torch.Generator().manual_seed(blocks)
    raw = bytes(torch.randint(0, 256, (32 * blocks,), generator=gen, dtype=torch.uint8).tolist())  # -8 included
    scales = (torch.randn(blocks, generator=gen) * 1e-3).tolist()
    assert _hostile(raw, scales, 64 * blocks, block=64).stats() == _stats_block_by_block(raw, scales)
    for k, at in [(k, at) for k in range(blocks) for at in range(64)][:: max(1, blocks // 7)]:
        lone = bytearray(32 * blocks)  # every code 0, but one -8: the largest is found wherever it sits
        lone[32 * k + at // 2] = 0x08 << 4 * (at % 2)
        assert _hostile(bytes(lone), [1.0] * blocks, 64 * blocks, block=64).stats() == (64.0, 8.0), (k, at)
    for where in {0, blocks - 1, blocks // 2}:  # a scale that is not finite, in the four-wide body or the rest
        for bad in (math.nan, math.inf):
            spoilt = [bad if b == where else s for b, s in enumerate(scales)]
            assert all(math.isnan(x) for x in _hostile(raw, spoilt, 64 * blocks, block=64).stats())


def _packed_update(tensors: dict[str, Packed]) -> Update:
    return _update("L0", PackedTensors(tensors), c_steps=4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "code"), [(0.01, None), (0.05, "out_of_bounds"), (math.nan, "non_finite"), (math.inf, "non_finite")]
)
def test_admission_reads_a_packed_update_as_its_decoded_values(value: float, code: str | None) -> None:
    """The same verdict and reason as for the decoded update, without decoding it."""
    limits = UpdateLimits(drift_per_step=0.01, max_steps=100, tokens_per_step=1000, param_bound=10.0)  # 4 steps: |v| <= 0.04
    packed = _packed_update({"w": _hostile(bytes([0x77] * 4), [value / 7], 8)})  # eight codes of 7: every value is `value`
    decoded = _update("L0", {"w": packed.tensors["w"].clone()}, c_steps=4)
    expected = {"w": torch.zeros(8)}
    verdicts = [check_update(u, expected, limits) for u in (packed, decoded)]
    assert verdicts[0] == verdicts[1]
    assert (verdicts[0].code if verdicts[0] else None) == code


def test_admission_refuses_a_packed_update_of_the_wrong_shape_without_decoding_it() -> None:
    packed = _packed_update({"w": _hostile(bytes(4), [1e-3], 8)})
    rejection = check_update(packed, {"w": torch.zeros(2, 4)}, UpdateLimits())
    assert rejection is not None and rejection.code == "bad_update" and "(8,)" in rejection.reason
    assert packed.tensors._decoded == {}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "senders",
    [("L0", "L1", "L2"), ("L0", "L0", "L1")],  # the second: L0 sends its next period's drift before the round closes
)
def test_a_syncer_fed_packed_updates_publishes_what_one_fed_decoded_updates_does(
    monkeypatch: pytest.MonkeyPatch, senders: tuple[str, ...]
) -> None:
    """Three rounds through the whole core: the fused path is taken (a learner's two updates added packed) and
    publishes what a syncer fed the decoded updates does."""
    reference_rounds: list[int] = []

    def counted(contributions, *args):  # type: ignore[no-untyped-def]
        reference_rounds.append(isinstance(contributions[0].tensors, PackedTensors | PackedSum))
        return merge_fragment(contributions, *args)

    monkeypatch.setattr(syncer_module, "merge_fragment", counted)
    learners = sorted(set(senders))
    quorum = len(learners)
    syncers = {"packed": small_syncer(quorum=quorum, fragments=1), "decoded": small_syncer(quorum=quorum, fragments=1)}
    gen = torch.Generator().manual_seed(11)
    for s in syncers.values():
        for learner in learners:
            s.register(0.0, learner)
    for r in range(3):
        for m, learner in enumerate(senders):
            base = update_for(syncers["packed"], learner, 0, c_tokens=400 + 100 * m, update_id=f"{learner}.{r}.{m}")
            tensors = {k: 1e-3 * torch.randn(t.shape, generator=gen) for k, t in base.tensors.items()}
            frame = encode_update(dataclasses.replace(base, tensors=tensors), "int4", 64)
            for kind, s in syncers.items():
                update = decode_update(frame if kind == "packed" else bytearray(frame))[0]
                assert isinstance(update.tensors, PackedTensors) == (kind == "packed")
                ack, _ = s.receive(float(r), update)
                assert ack.status == "accepted"
        twice = [name for name in learners if senders.count(name) > 1]
        assert all(isinstance(syncers["packed"].rounds[0].fresh[name].tensors, PackedSum) for name in twice)
        for s in syncers.values():
            s.close_round(float(r), 0, "all_arrived", "test")
    assert syncers["packed"].versions == syncers["decoded"].versions == [3]
    assert reference_rounds == [False] * 3  # only the decoded syncer took the reference path
    _assert_close(syncers["packed"].fragments[0], syncers["decoded"].fragments[0])
    _assert_close(syncers["packed"].buffers[0], syncers["decoded"].buffers[0])
    assert syncers["packed"].ledger.merged == syncers["decoded"].ledger.merged > 0

"""Tests for ddctl_agents.core.codec: the outer-gradient wire format.

Every behavioural test runs twice, on the native kernels and on the torch
reference (``DDCTL_NO_NATIVE=1``); a missing native module is a failure, not a
skip, because ``setup.py`` builds it on every supported machine.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ddctl_agents.core import _native, codec
from ddctl_agents.core.codec import CODECS, CodecError, decode, encode, encoded_nbytes, roundtrip
from ddctl_agents.errors import AgentError

BLOCKS = (8, 16, 64, 128, 4096)
QUANTIZED = ("int8", "int4", "int2", "int1")
# Bound on |x - decode(encode(x))| as a multiple of the block's absmax: half a step.
HALF_STEP = {"int8": 1 / 254, "int4": 1 / 14, "int2": 1 / 3, "int1": 1.0}
TINY = 1e-36  # blocks this small quantize to zero (see the codec docstring)

props = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
# Up to 2**126 (~8.5e37): a block at float32's very maximum may decode to Inf (documented).
finite32 = st.floats(-(2.0**126), 2.0**126, width=32)
vectors = arrays(np.float32, st.integers(0, 700), elements=finite32)
blocks = st.sampled_from(BLOCKS)


@pytest.fixture(params=["native", "reference"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Select the code path for one test through the DDCTL_NO_NATIVE variable."""
    if request.param == "native":
        monkeypatch.delenv(_native.NO_NATIVE_ENV, raising=False)
        _require_native()
    else:
        monkeypatch.setenv(_native.NO_NATIVE_ENV, "1")
        assert not codec.native_available()
    return str(request.param)


def _require_native() -> None:
    if not codec.native_available():
        pytest.fail(
            f"native codec kernels unavailable: {_native.missing_reason()}; build them with `python setup.py build_ext --inplace`"
        )


def _t(values: np.ndarray | list[float]) -> torch.Tensor:
    return torch.from_numpy(np.array(values, dtype=np.float32))


def _block_absmax(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per-element absmax of the element's block."""
    out = torch.empty_like(x)
    for start in range(0, x.numel(), block):
        out[start : start + block] = x[start : start + block].abs().max()
    return out


def _scales(payload: bytes, numel: int, block: int) -> list[float]:
    count = -(-numel // block)
    return list(struct.unpack(f"<{count}f", payload[: 4 * count]))


# ---------------------------------------------------------------- sizes and API


def test_public_names() -> None:
    assert set(codec.__all__) == {
        "CODECS", "DEFAULT_BLOCK", "CodecError", "decode", "encode",
        "encoded_nbytes", "native_available", "roundtrip",
    }  # fmt: skip
    assert CODECS == ("fp32", "bf16", "int8", "int4", "int2", "int1")
    assert codec.DEFAULT_BLOCK == 128
    assert issubclass(CodecError, AgentError) and not issubclass(CodecError, ValueError)  # a bug is not bad input


@pytest.mark.parametrize(
    ("name", "expected"),
    [("fp32", 1200), ("bf16", 600), ("int8", 312), ("int4", 162), ("int2", 87), ("int1", 50)],
)
def test_encoded_nbytes_known_values(name: str, expected: int) -> None:
    # 300 values, block 128: 3 scales (12 bytes) + the packed codes.
    assert encoded_nbytes(name, 300, 128) == expected
    assert encoded_nbytes(name, 0, 128) == 0


@props
@given(x=vectors, block=blocks, name=st.sampled_from(CODECS))
def test_payload_size_is_encoded_nbytes(path: str, x: np.ndarray, block: int, name: str) -> None:
    payload = encode(name, _t(x), block)
    assert isinstance(payload, bytes)
    assert len(payload) == encoded_nbytes(name, x.size, block)
    out = decode(name, payload, x.size, block)
    assert out.dtype == torch.float32 and out.shape == (x.size,)


# ---------------------------------------------------------------- error bounds


@props
@given(x=vectors, block=blocks, name=st.sampled_from(("int8", "int4", "int2")))
def test_symmetric_codecs_err_at_most_half_a_step(path: str, x: np.ndarray, block: int, name: str) -> None:
    t = _t(x)
    err = (roundtrip(name, t, block) - t).abs()
    bound = _block_absmax(t, block) * (HALF_STEP[name] * (1 + 1e-5)) + TINY
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item()}"


@props
@given(x=vectors, block=blocks)
def test_int1_keeps_sign_and_block_mean(path: str, x: np.ndarray, block: int) -> None:
    t = _t(x)
    y = roundtrip("int1", t, block)
    assert torch.equal(torch.signbit(y), t < 0)
    for start in range(0, t.numel(), block):
        part = t[start : start + block].double()
        mean = part.abs().mean().item()
        assert y[start : start + block].abs().tolist() == pytest.approx([mean] * part.numel(), rel=1e-5, abs=1e-38)


@props
@given(x=vectors)
def test_bf16_relative_error(path: str, x: np.ndarray) -> None:
    t = _t(x)
    err = (roundtrip("bf16", t) - t).abs()
    assert bool((err <= t.abs() * 2**-8 + 1e-38).all())


@props
@given(x=vectors)
def test_fp32_is_exact(path: str, x: np.ndarray) -> None:
    t = _t(x)
    assert encode("fp32", t) == x.astype("<f4").tobytes()
    assert encode("fp32", _t([3.4028235e38])) == struct.pack("<f", 3.4028235e38)
    assert torch.equal(roundtrip("fp32", t).view(torch.int32), t.view(torch.int32))


def test_relative_error_orders_codecs_on_gaussian_data(path: str) -> None:
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(7))
    rel = {name: ((roundtrip(name, x) - x).norm() / x.norm()).item() for name in CODECS}
    assert rel["fp32"] == 0.0
    assert rel["bf16"] < rel["int8"] < rel["int4"] < rel["int2"] < rel["int1"]
    assert rel["int4"] < 0.125  # near-lossless regime of ALGORITHM.md §5


# ---------------------------------------------------------------- special blocks


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("numel", [0, 1, 5, 8, 127, 128, 129, 300])
def test_zeros_decode_to_zeros_with_zero_scales(path: str, name: str, numel: int) -> None:
    payload = encode(name, torch.zeros(numel), 128)
    assert torch.equal(decode(name, payload, numel, 128), torch.zeros(numel))
    if name in QUANTIZED:
        assert _scales(payload, numel, 128) == [0.0] * (-(-numel // 128))


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("value", [3.25, -0.1, 1e-20, 6e37])
def test_all_equal_block_is_reproduced(path: str, name: str, value: float) -> None:
    x = torch.full((40,), value)
    assert roundtrip(name, x, 8).tolist() == pytest.approx(x.tolist(), rel=1e-6)


def test_negative_zero_and_tiny_blocks_decode_to_zero(path: str) -> None:
    x = _t([-0.0] * 8 + [1e-40, -3e-41] + [0.0] * 6)
    for name in ("int8", "int4"):
        y = roundtrip(name, x, 8)
        assert bool((y == 0).all()), name


@pytest.mark.parametrize("name", QUANTIZED)
def test_tail_block_gets_its_own_scale(path: str, name: str) -> None:
    # 128 large values then a 3-value tail: the tail must not inherit the big scale.
    x = torch.cat([torch.full((128,), 100.0), _t([1.0, -0.5, 0.25])])
    payload = encode(name, x, 128)
    tail_scale = _scales(payload, 131, 128)[1]
    if name == "int1":
        assert tail_scale == pytest.approx(1.75 / 3)
    else:
        assert tail_scale == pytest.approx(1.0 / {"int8": 127, "int4": 7, "int2": 1.5}[name])
    err = (decode(name, payload, 131, 128)[128:] - x[128:]).abs()
    assert bool((err <= HALF_STEP[name] * 1.0 + 1e-6).all())


@pytest.mark.parametrize(("name", "level"), [("int4", 7.0), ("int8", 127.0)])
def test_ties_round_half_to_even(path: str, name: str, level: float) -> None:
    # absmax == level gives scale 1, so x * inv lands exactly on .5 ties.
    x = _t([level, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5])
    assert roundtrip(name, x, 8).tolist() == [level, 0.0, 2.0, 2.0, 0.0, -2.0, -2.0, 4.0]


# ---------------------------------------------------------------- hand-made layouts


def test_int4_nibble_order_hand_example(path: str) -> None:
    # Scale 1.0; element 0 (1) in the low nibble, element 1 (-1 = 0xF) in the high
    # nibble of byte 0; element 2 (7) alone in byte 1 with a zero high nibble.
    payload = encode("int4", _t([1.0, -1.0, 7.0]), 8)
    assert payload == struct.pack("<f", 1.0) + bytes([0xF1, 0x07])
    assert decode("int4", payload, 3, 8).tolist() == [1.0, -1.0, 7.0]


def test_int4_decodes_unused_nibble_8_as_minus_8(path: str) -> None:
    payload = struct.pack("<f", 0.5) + bytes([0x78])
    assert decode("int4", payload, 2, 8).tolist() == [-4.0, 3.5]


def test_int8_layout_hand_example(path: str) -> None:
    payload = encode("int8", _t([127.0, -1.0, 0.0]), 8)
    assert payload == struct.pack("<f", 1.0) + bytes([127, 0xFF, 0])


def test_int2_layout_hand_example(path: str) -> None:
    # absmax 1.5 -> scale 1; levels -1.5, -0.5, 0.5, 1.5 are codes 0..3 at bits 2j.
    payload = encode("int2", _t([-1.5, -0.5, 0.5, 1.5, 0.0]), 8)
    assert payload == struct.pack("<f", 1.0) + bytes([0b11100100, 0b10])
    assert decode("int2", payload, 5, 8).tolist() == [-1.5, -0.5, 0.5, 1.5, 0.5]


def test_int1_layout_hand_example(path: str) -> None:
    x = _t([1, -1, -1, 1, 1, 1, 1, 1, -2])
    payload = encode("int1", x, 8)
    assert payload == struct.pack("<2f", 1.0, 2.0) + bytes([0b110, 0b1])
    assert decode("int1", payload, 9, 8).tolist() == x.tolist()


def test_bf16_is_little_endian_round_to_nearest_even() -> None:
    x = _t([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8])
    assert encode("bf16", x) == struct.pack("<3H", 0x3F80, 0x3F80, 0x3F82)


# ---------------------------------------------------------------- native == reference


def _both_paths(monkeypatch: pytest.MonkeyPatch, name: str, x: torch.Tensor, block: int) -> None:
    monkeypatch.delenv(_native.NO_NATIVE_ENV, raising=False)
    _require_native()
    fast = encode(name, x, block)
    fast_out = decode(name, fast, x.numel(), block)
    monkeypatch.setenv(_native.NO_NATIVE_ENV, "1")
    slow = encode(name, x, block)
    slow_out = decode(name, fast, x.numel(), block)
    assert fast == slow
    assert torch.equal(fast_out.view(torch.int32), slow_out.view(torch.int32))


@props
@given(x=vectors, block=blocks, name=st.sampled_from(("int8", "int4")))
def test_native_matches_reference_bytes(monkeypatch: pytest.MonkeyPatch, x: np.ndarray, block: int, name: str) -> None:
    _both_paths(monkeypatch, name, _t(x), block)


@pytest.mark.parametrize("name", ("int8", "int4"))
def test_native_matches_reference_on_large_and_edge_inputs(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(100_003, generator=gen) * torch.logspace(-30, 30, 100_003)
    ties = torch.arange(-64, 64, dtype=torch.float32) / 2  # exact .5 steps
    edge = _t([3.4e38, -3.4e38, 1e-45, -1e-45, 1.2e-38, -0.0, 0.0, 2.0**-126])
    for values in (x, ties, edge, torch.cat([edge, ties, x[:77]])):
        for block in (8, 128, 4096):
            _both_paths(monkeypatch, name, values, block)


# ---------------------------------------------------------------- inputs and rejection


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_encode_as_their_fp32_values(path: str, dtype: torch.dtype) -> None:
    x = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(1)).to(dtype)
    assert encode("int4", x) == encode("int4", x.to(torch.float32).flatten())
    y = roundtrip("int4", x)
    assert y.dtype == torch.float32 and y.shape == x.shape


def test_non_contiguous_input_encodes_in_logical_order(path: str) -> None:
    x = torch.randn(40, 30, generator=torch.Generator().manual_seed(2)).t()
    assert encode("int8", x, 16) == encode("int8", x.contiguous(), 16)


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_decode_accepts_buffers_and_returns_a_fresh_tensor(path: str, kind: type) -> None:
    x = torch.randn(100, generator=torch.Generator().manual_seed(4))
    payload = encode("fp32", x)
    out = decode("fp32", kind(payload), 100)
    out.add_(1.0)  # writable and not aliasing the payload
    assert decode("fp32", payload, 100).tolist() == x.tolist()


@pytest.mark.parametrize("name", CODECS)
def test_decode_reads_an_unaligned_memoryview(path: str, name: str) -> None:
    x = torch.randn(301, generator=torch.Generator().manual_seed(5))
    payload = encode(name, x, 16)
    shifted = memoryview(b"\x99" + payload)[1:]  # scales no longer 4-byte aligned
    assert torch.equal(decode(name, shifted, 301, 16), decode(name, payload, 301, 16))


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [0, 200])
def test_encode_rejects_non_finite(path: str, name: str, bad: float, where: int) -> None:
    x = torch.ones(203)
    x[where] = bad
    with pytest.raises(CodecError, match="NaN or Inf"):
        encode(name, x)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("delta", [-1, 1])
def test_decode_rejects_wrong_payload_length(path: str, name: str, delta: int) -> None:
    payload = encode(name, torch.ones(130))
    wrong = payload + b"\0" if delta > 0 else payload[:-1]
    with pytest.raises(CodecError, match=f"must be {len(payload)} bytes"):
        decode(name, wrong, 130)


def test_rejects_unknown_codec() -> None:
    with pytest.raises(CodecError, match="unknown codec 'fp8'"):
        encode("fp8", torch.ones(4))
    with pytest.raises(CodecError, match="unknown codec"):
        decode("int3", b"", 0)
    with pytest.raises(CodecError, match="unknown codec"):
        encoded_nbytes("", 1)


@pytest.mark.parametrize("block", [0, -8, 4, 12, 4104, 8192, 128.0, True])
def test_rejects_bad_block(block: object) -> None:
    with pytest.raises(CodecError, match="multiple of 8"):
        encode("int4", torch.ones(16), block)  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="multiple of 8"):
        encoded_nbytes("int4", 16, block)  # type: ignore[arg-type]


@pytest.mark.parametrize("x", [torch.ones(8, dtype=torch.int32), torch.ones(8, dtype=torch.bool)])
def test_encode_rejects_non_float_tensors(x: torch.Tensor) -> None:
    with pytest.raises(CodecError, match="floating-point"):
        encode("int4", x)
    with pytest.raises(CodecError, match="torch.Tensor"):
        encode("int4", [1.0, 2.0])  # type: ignore[arg-type]


def test_rejects_bad_numel_and_payload_type() -> None:
    with pytest.raises(CodecError, match="non-negative"):
        encoded_nbytes("int4", -1)
    with pytest.raises(CodecError, match="bytes-like"):
        decode("int4", [0, 0], 1)  # type: ignore[arg-type]


def test_env_var_forces_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_native.NO_NATIVE_ENV, "1")
    assert not codec.native_available()
    assert "DDCTL_NO_NATIVE" in _native.missing_reason()
    monkeypatch.setenv(_native.NO_NATIVE_ENV, "0")
    assert codec.native_available() == (_native.kernels() is not None)

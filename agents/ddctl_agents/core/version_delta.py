"""Fragment versions sent as int8 deltas from the version a learner holds (``down_codec: int8-delta``).

Most of a learner's bytes come down: a version of every fragment each period, in
bf16. Consecutive versions differ by one outer step, so the difference coded in
int8 with block scales is about half of bf16's bytes. Its rounding error must not
pile up: every learner following the stream holds the same fp32 *reconstruction*
of each fragment (``Held``), and each delta is taken from that reconstruction, not
from the true previous values, so what one delta rounds off the next one carries
(error feedback). The error is then one int8 rounding of one step, which is finer
than bf16's rounding of the values themselves: learners adopt values closer to
the synchronizer's than the bf16 codec gives them. The decode's multiply and the
fp32 add are separate operations on the CPU: a learner and the synchronizer hold
the same bits.

A learner that does not hold the previous version of the chain (it just joined,
or its stream broke while versions went by) is sent the reconstruction whole, in
fp32 (``exact``): once, then deltas again. That frame is made only when someone
needs it (``Exact``): a version followed by every learner costs the synchronizer
its fp32 values, a bf16 and a delta frame (7 bytes per value), not 4 more. A
learner at cadence k > 1 is sent only the versions it adopts, so it could never
step from the last one: it is sent each whole in bf16 (``key``), as with the
bf16 codec, and adopts that rounding.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from ddctl_agents.core.choices import DELTA, wire_codec
from ddctl_agents.core.codec import all_finite
from ddctl_agents.core.messages import FragmentVersion, decode_fragment, encode_fragment, fragment_version
from ddctl_agents.core.wire import DEFAULT_LIMITS, WireLimits, is_count, pack, unpack
from ddctl_agents.errors import WireError

DELTA_CODEC = wire_codec(DELTA)
"""How a delta's values travel."""


@dataclass(frozen=True, slots=True)
class Held:
    """A fragment as a learner following the stream holds it: a version and its values (fp32)."""

    version: int
    values: Mapping[str, torch.Tensor]


@dataclass(eq=False, slots=True)
class Exact:
    """A chain's version whole in fp32, as its followers hold it: encoded on first use, then kept with the version.

    Only a learner that joins or lost the stream needs it, so most versions never make it."""

    message: FragmentVersion
    block: int
    _frame: bytes | None = None
    _making: threading.Lock = field(default_factory=threading.Lock)

    @property
    def ready(self) -> bool:
        return self._frame is not None

    def frame(self) -> bytes:
        with self._making:  # two joiners at once encode it once
            if self._frame is None:
                self._frame = encode_fragment(self.message, "fp32", self.block)
            return self._frame


def pick(key: bytes, exact: Exact | None, delta: bytes | None, base: int, holds: int, rounded: bool) -> bytes | Exact:
    """What a learner holding version ``holds`` of a fragment (-1: none) is sent: the delta where it steps from
    that version, else the version whole, exactly (``Exact``: the caller makes its frame where it suits it);
    ``rounded`` (cadence k > 1) or without a chain, ``key``."""
    if rounded or exact is None:
        return key
    return delta if delta is not None and holds == base else exact


@dataclass(frozen=True, slots=True)
class Coded:
    """One version, coded: as learners following the chain hold it (``message``) and as a held learner adopts it
    (``rounded``), with their frames: ``exact``, ``key`` and a delta from ``base`` (or none)."""

    message: FragmentVersion
    rounded: FragmentVersion
    key: bytes
    exact: Exact | None
    """None without a chain: ``key`` is the version."""
    delta: bytes | None
    base: int
    """The version ``delta`` steps from; -1 where there is no delta."""

    def sent(self, holds: int, rounded: bool) -> tuple[bytes, FragmentVersion]:
        """The frame a learner holding version ``holds`` is sent, and the version it makes there."""
        chosen = pick(self.key, self.exact, self.delta, self.base, holds, rounded)
        if isinstance(chosen, Exact):
            return chosen.frame(), self.message
        return chosen, self.rounded if chosen is self.key else self.message


class Whole:
    """The other down codecs' side: every version whole, as learners decode it (``adopted``; without it, the
    service's case, ``message`` and ``rounded`` are the version as given: no one there adopts it)."""

    def __init__(self, codec: str, block: int, adopted: bool = True) -> None:
        self.codec, self.block, self.adopted = codec, block, adopted

    def code(self, message: FragmentVersion) -> Coded:
        key = encode_fragment(message, self.codec, self.block)
        decoded = decode_fragment(key)[0] if self.adopted else message
        return Coded(message=decoded, rounded=decoded, key=key, exact=None, delta=None, base=-1)


def coder(down_codec: str, block: int, adopted: bool = True) -> Whole | Chains:
    """What turns versions into what learners are sent, for ``down_codec`` (``adopted``: and what they adopt, for a
    virtual cluster and its replay; a service sends frames only)."""
    return Chains(block, adopted) if down_codec == DELTA else Whole(down_codec, block, adopted)


class Chains:
    """The synchronizer's side: per fragment, the newest version as every learner following it holds it."""

    def __init__(self, block: int, adopted: bool = True) -> None:
        self.block, self.adopted = block, adopted
        self.latest: dict[int, Coded] = {}

    def code(self, message: FragmentVersion) -> Coded:
        """``message`` coded; the chain steps forward when it is newer than the chain's head."""
        head = self.latest.get(message.fragment)
        if head is not None and head.message.version == message.version:
            return head  # sent again (a bootstrap, a resync): the same bits
        if head is None or head.message.version > message.version or not _same_shapes(head.message.tensors, message.tensors):
            own = {name: t.detach().float().clone() for name, t in message.tensors.items()}  # not the live values
            coded = self._coded(replace(message, tensors=own), None, -1)  # a chain starts exact
            if head is None or head.message.version < message.version:
                self.latest[message.fragment] = coded
            return coded
        held = head.message.tensors
        diffs = {name: message.tensors[name].float() - held[name] for name in held}
        delta = pack("fragment", {**message.meta(), "base": head.message.version}, diffs, DELTA_CODEC, self.block)
        values = step(held, unpack(delta, expect="fragment").tensors)
        coded = self._coded(replace(message, tensors=values), delta, head.message.version)
        self.latest[message.fragment] = coded
        return coded

    def _coded(self, message: FragmentVersion, delta: bytes | None, base: int) -> Coded:
        key = encode_fragment(message, "bf16", self.block)
        bf16 = {name: t.bfloat16() for name, t in message.tensors.items()} if self.adopted else None
        rounded = message if bf16 is None else replace(message, tensors=_fp32(bf16))
        return Coded(message=message, rounded=rounded, key=key, exact=Exact(message, self.block), delta=delta, base=base)


def step(held: Mapping[str, torch.Tensor], deltas: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reconstruction after one delta: one fp32 add (the same bits on both sides)."""
    return {name: held[name] + deltas[name].reshape(held[name].shape) for name in held}


def receive(
    data: bytes | bytearray | memoryview, held: Mapping[int, Held], limits: WireLimits = DEFAULT_LIMITS
) -> tuple[FragmentVersion, Held]:
    """A frame of the stream, whole or a delta, as the version it makes of what this learner ``held``.

    Raises ``WireError`` for a delta from a version this learner does not hold, or of other tensors, and for a
    version with a value that is not finite (a learner adopting it would train on nothing but NaN)."""
    frame = unpack(data, limits, expect="fragment")
    message = fragment_version(frame)
    if "base" not in frame.meta:
        return _finite(message, _fp32(message.tensors))
    base, mine = frame.meta["base"], held.get(message.fragment)
    if not is_count(base) or mine is None or mine.version != base or base >= message.version:
        holds = "nothing" if mine is None else f"version {mine.version}"
        raise WireError(
            f"a delta of fragment {message.fragment} from version {base!r:.60} to {message.version}; this learner holds {holds}"
        )
    if not _same_shapes(mine.values, frame.tensors):
        raise WireError(f"a delta of fragment {message.fragment} names other tensors or shapes than the version it steps from")
    return _finite(message, step(mine.values, frame.tensors))


def _finite(message: FragmentVersion, values: dict[str, torch.Tensor]) -> tuple[FragmentVersion, Held]:
    for name, t in values.items():
        if not all_finite(t.reshape(-1)):
            raise WireError(f"version {message.version} of fragment {message.fragment}: {name} has a value that is not finite")
    return replace(message, tensors=values), Held(message.version, values)


def _fp32(values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.float() for name, t in values.items()}


def _same_shapes(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[name].shape == b[name].shape for name in a)

"""The two messages that carry tensors, as typed values over ``wire`` frames.

``Update`` goes learner -> syncer: one fragment's outer gradient with the
counters that weight it. ``FragmentVersion`` goes syncer -> learners: the new
global values of a fragment. Metadata from the network is validated field by
field; a bad field raises ``WireError`` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ddctl_agents.core import vclock
from ddctl_agents.core.packed import measure as measure_packed
from ddctl_agents.core.wire import DEFAULT_LIMITS, Frame, WireLimits, is_count, pack, unpack
from ddctl_agents.errors import WireError

Adoption = tuple[int, int, int]
"""(fragment, version, learner step at which it was adopted)."""
Absorbed = tuple[str, int, int]
"""An update that a later one of its fragment took in before it was sent (``absorb``): (its update id, the learner
step it was made at, how many of the adoptions it carried). What a replay needs to make it again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Update:
    """A learner's outer gradient for one fragment, relative to ``base_version``."""

    learner: str
    fragment: int
    base_version: int
    update_id: str
    step: int
    c_steps: int
    c_tokens: int
    tensors: Mapping[str, torch.Tensor]
    step_time: float = 0.0
    incarnation: int = 0
    vclock: Mapping[str, int] = field(default_factory=dict)
    adoptions: tuple[Adoption, ...] = ()
    absorbed: tuple[Absorbed, ...] = ()
    """Oldest first; their adoptions come first in ``adoptions``, in the same order."""

    def meta(self) -> dict[str, Any]:
        absorbed = {"absorbed": [list(a) for a in self.absorbed]} if self.absorbed else {}
        return {
            "learner": self.learner,
            "incarnation": self.incarnation,
            "fragment": self.fragment,
            "base_version": self.base_version,
            "update_id": self.update_id,
            "step": self.step,
            "c_steps": self.c_steps,
            "c_tokens": self.c_tokens,
            "step_time": self.step_time,
            "vclock": dict(self.vclock),
            "adoptions": [list(a) for a in self.adoptions],
        } | absorbed


@dataclass(frozen=True, slots=True, kw_only=True)
class FragmentVersion:
    """Global values of fragment ``fragment`` after round ``version``."""

    fragment: int
    version: int
    tensors: Mapping[str, torch.Tensor]
    vclock: Mapping[str, int] = field(default_factory=dict)

    def meta(self) -> dict[str, Any]:
        return {"fragment": self.fragment, "version": self.version, "vclock": dict(self.vclock)}


def absorb(older: Update, newer: Update) -> Update:
    """One update carrying both: the same learner's drift of one fragment from one base, queued and not yet sent.

    A learner's outer gradients of a fragment from the same base are consecutive drifts (each measured from
    where the previous one ended), so their sum is the drift since the first one began: what the syncer would
    have added up in its round anyway (``rounds.accumulate``), in one frame instead of two."""
    if (older.learner, older.fragment, older.base_version) != (newer.learner, newer.fragment, newer.base_version):
        raise ValueError("only one learner's updates of one fragment from one base version add up")
    tensors = {name: older.tensors[name].float() + newer.tensors[name].float() for name in newer.tensors}
    own = len(older.adoptions) - sum(n for _, _, n in older.absorbed)  # the older update's own, past what it took in
    absorbed = (*older.absorbed, (older.update_id, older.step, own), *newer.absorbed)
    return replace(newer, tensors=tensors, c_steps=older.c_steps + newer.c_steps, c_tokens=older.c_tokens + newer.c_tokens,
                   adoptions=older.adoptions + newer.adoptions, absorbed=absorbed)  # fmt: skip


def encode_update(update: Update, codec: str, block: int) -> bytes:
    return pack("update", update.meta(), update.tensors, codec, block)


def encode_fragment(message: FragmentVersion, codec: str, block: int) -> bytes:
    return pack("fragment", message.meta(), message.tensors, codec, block)


def decode_update(
    data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS, measure: bool = False
) -> tuple[Update, Frame]:
    """An update from its frame; int8/int4 tensors of an immutable frame stay packed for the syncer's fused round.

    ``measure`` takes their admission figures now (``packed.measure``: on the caller's thread, not the core's)."""
    frame = unpack(data, limits, expect="update", keep_packed=isinstance(data, bytes))
    if measure:
        measure_packed(frame.tensors)
    m = frame.meta
    update = Update(
        learner=_text(m, "learner"),
        incarnation=_count(m, "incarnation"),
        fragment=_count(m, "fragment"),
        base_version=_count(m, "base_version"),
        update_id=_text(m, "update_id"),
        step=_count(m, "step"),
        c_steps=_count(m, "c_steps"),
        c_tokens=_count(m, "c_tokens"),
        step_time=_seconds(m, "step_time"),
        vclock=_clock(m),
        adoptions=_adoptions(m),
        tensors=frame.tensors,
    )
    return replace(update, absorbed=_absorbed(m, update)), frame


def decode_fragment(data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS) -> tuple[FragmentVersion, Frame]:
    """A whole version; a delta (``core/version_delta.py``) is refused: its values are not the fragment's."""
    frame = unpack(data, limits, expect="fragment")
    if "base" in frame.meta:
        raise WireError(f"a delta from version {frame.meta['base']!r:.60}, not a whole version (version_delta.receive reads it)")
    return fragment_version(frame), frame


def fragment_of(data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS) -> tuple[int, int]:
    """A whole version's (fragment, version), the frame checked as ``decode_fragment`` checks it but its tensors not
    decoded: what a relay needs to forward it."""
    frame = unpack(data, limits, expect="fragment", tensors=False)
    if "base" in frame.meta:
        raise WireError(f"a delta from version {frame.meta['base']!r:.60}, not a whole version")
    return _count(frame.meta, "fragment"), _count(frame.meta, "version")


def fragment_version(frame: Frame) -> FragmentVersion:
    """A fragment frame's metadata, checked field by field, with its tensors."""
    m = frame.meta
    return FragmentVersion(fragment=_count(m, "fragment"), version=_count(m, "version"), vclock=_clock(m), tensors=frame.tensors)


def _text(m: Mapping[str, Any], key: str, field: str = "") -> str:
    """``field``: how the message names it, where ``key`` is not a field of its own (default: the key)."""
    v = m.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= 128 or not v.isascii() or not v.isprintable():
        raise WireError(f"meta field {field or repr(key)} must be 1-128 printable ASCII characters")
    return v


def _count(m: Mapping[str, Any], key: str) -> int:
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62:
        raise WireError(f"meta field {key!r} must be a non-negative integer, got {v!r:.60}")
    return v


MOST_SECONDS = 86_400.0
"""A step takes at most a day: the bound a heartbeat's step time has (``service/requests.Seconds``)."""


def _seconds(m: Mapping[str, Any], key: str) -> float:
    v = m.get(key, 0.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MOST_SECONDS:  # NaN fails it too
        raise WireError(f"meta field {key!r} must be a number of seconds in [0, {MOST_SECONDS:g}], got {v!r:.40}")
    return float(v)


def _clock(m: Mapping[str, Any]) -> dict[str, int]:
    try:
        return vclock.validate(m.get("vclock", {}))
    except ValueError as exc:
        raise WireError(f"meta field 'vclock': {exc}") from None


def _adoptions(m: Mapping[str, Any]) -> tuple[Adoption, ...]:
    raw = m.get("adoptions", [])
    if not isinstance(raw, list) or len(raw) > 1 << 16:
        raise WireError("meta field 'adoptions' must be a list of at most 65536 [fragment, version, step] triples")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3 and all(is_count(x) for x in item)):
            raise WireError(f"meta field 'adoptions' has a bad entry {item!r:.60}; expected [fragment, version, step]")
        out.append((item[0], item[1], item[2]))
    return tuple(out)


def _absorbed(m: Mapping[str, Any], update: Update) -> tuple[Absorbed, ...]:
    """The updates ``update`` took in: each made before it, with no more adoptions between them than it carries."""
    raw = m.get("absorbed", [])
    if not isinstance(raw, list) or len(raw) > 1 << 16:
        raise WireError("meta field 'absorbed' must be a list of at most 65536 [update_id, step, adoptions] triples")
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3 and all(is_count(x) for x in item[1:])):
            raise WireError(f"meta field 'absorbed' has a bad entry {item!r:.80}; expected [update_id, step, adoptions]")
        out.append((_text({"id": item[0]}, "id", "'absorbed' update id"), item[1], item[2]))
    if any(step > update.step for _, step, _ in out) or sum(n for _, _, n in out) > len(update.adoptions):
        raise WireError(
            f"meta field 'absorbed' names updates made after this one (step {update.step}) or more adoptions than its "
            f"{len(update.adoptions)}"
        )
    if len({uid for uid, _, _ in out} | {update.update_id}) != len(out) + 1:
        raise WireError("meta field 'absorbed' names an update twice, or this update itself")
    return tuple(out)

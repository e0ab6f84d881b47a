"""Vector clocks: which events could have influenced which.

A clock maps a process id (each learner, plus ``SYNCER``) to the number of
events it has seen from that process. Clocks are plain dicts, never mutated:
every function returns a new one, so records can hold them safely.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

SYNCER = "syncer"
CUT = "cut"
"""Not a process: the checkpoint epoch (Chandy-Lamport colouring) a sharded synchronizer's messages carry. Merged by
maximum like every entry, which is exactly the colouring rule: whoever has seen epoch e passes e on."""
VectorClock = dict[str, int]
MOST_COUNT = 2**53 - 1
"""The largest entry an untrusted clock may hold: a count any JSON reader holds exactly (a clock goes into every
published version and tape record)."""


MOST_LEARNERS = 64
"""A job's learners are L0 .. L63 at most (``BudgetConfig.learners``)."""
MOST_SHARDS = 64
"""A synchronizer has at most this many shards (``shardmap.MAX_SHARDS``; shardmap imports this module)."""
_LEARNER = re.compile(r"L(0|[1-9][0-9]?)\Z")
_SHARD = re.compile(r"S[0-9]{1,3}\Z")  # shardmap.SHARD_NAME


def own(clock: Mapping[str, int]) -> VectorClock:
    """Only the entries a job's processes can have: its learners, ``syncer`` or its shards, and ``cut``.

    A version's clock comes from another process: merging its other keys would grow the learner's clock, which goes
    into every update, past what the synchronizer accepts. At most ``MOST_LEARNERS + MOST_SHARDS + 2`` entries stay
    (the first shard names in sorted order when there are more)."""
    keys = [k for k in clock if isinstance(k, str)]
    learners = {k: clock[k] for k in keys if _LEARNER.match(k) and int(k[1:]) < MOST_LEARNERS}
    shards = sorted(k for k in keys if _SHARD.match(k))[:MOST_SHARDS]
    fixed = {k: clock[k] for k in (SYNCER, CUT) if k in clock}
    return {**learners, **{k: clock[k] for k in shards}, **fixed}


def tick(clock: Mapping[str, int], process: str) -> VectorClock:
    """The clock after ``process`` performs one local event."""
    out = dict(clock)
    out[process] = out.get(process, 0) + 1
    return out


def merge(a: Mapping[str, int], b: Mapping[str, int]) -> VectorClock:
    """Element-wise maximum: what a receiver knows after a message."""
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b))}


def receive(local: Mapping[str, int], message: Mapping[str, int], process: str) -> VectorClock:
    """Merge a message's clock, then count the receive as an event of ``process``."""
    return tick(merge(local, message), process)


def leq(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    return all(v <= b.get(k, 0) for k, v in a.items())


def happened_before(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    """True when the event stamped ``a`` could have caused the one stamped ``b``."""
    return leq(a, b) and not leq(b, a)


def concurrent(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    return not leq(a, b) and not leq(b, a)


def validate(clock: object, *, max_entries: int = 4096) -> VectorClock:
    """Check an untrusted clock: a mapping of short strings to non-negative ints."""
    if not isinstance(clock, Mapping) or len(clock) > max_entries:
        raise ValueError(f"vector clock must be a mapping of at most {max_entries} entries")
    out: VectorClock = {}
    for k, v in clock.items():
        if not isinstance(k, str) or not 0 < len(k) <= 128:
            raise ValueError(f"vector clock key must be a string of 1-128 characters, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MOST_COUNT:
            raise ValueError(f"vector clock entry {k!r} must be an integer in [0, 2**53), got {str(v)[:40]}")
        out[k] = v
    return out

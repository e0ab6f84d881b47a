"""One order for a sharded synchronizer's tapes that no shard, learner or message contradicts.

Shards never talk to one another, so each tape is its own total order; what ties them together travels
through learners. A fragment version carries its shard's vector clock, the learner merges it, and its next
update carries it to whichever shard that update goes to. A merged order keeps:

- each tape's own order;
- each record after every record of another shard that its clock has seen (a record at shard B whose clock
  says ``S0: 7`` comes after S0's records up to its seventh event: a version it adopted was made there);
- each learner's updates in the order it made them (incarnation, then the sequence number of the update
  id), and a learner's new incarnation's joins after every update of its earlier ones; this rule only where
  updates arrive in the order they were made (a virtual cluster's, one upload at a time per learner);
- a fragment's handoff into its new shard after the handoff out of its old one (same fragment, same epoch).

Among the records these allow, the earliest recorded time goes first, then the lower shard, so a virtual
cluster's tapes merge into the order its events happened; a real run's clocks (one per machine) only break
ties. Pure: records in, (tape, index) pairs out.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ddctl_agents.core import vclock
from ddctl_agents.errors import TapeError

Position = tuple[int, int]
"""(tape index, record index within that tape)."""


def causal_order(
    tapes: Sequence[Sequence[Mapping[str, Any]]], names: Sequence[str], learners_in_order: bool = True
) -> list[Position]:
    """Every record of ``tapes`` (shard ``names[i]``'s tape is ``tapes[i]``) once, in an order that keeps the rules
    of the module docstring; TapeError names the record if the tapes contradict one another.

    ``learners_in_order``: each learner's updates arrived in the order it made them (the virtual cluster's one
    upload at a time). Not so for a service's learners, which keep several in flight."""
    if len(tapes) != len(names) or len(set(names)) != len(names):
        raise TapeError(f"one tape per shard, each named once: got {len(tapes)} tapes for shards {list(names)}")
    clocks = [[_clock(i, record) for i, record in enumerate(tape)] for tape in tapes]
    before: dict[Position, set[Position]] = defaultdict(set)
    for t, tape in enumerate(tapes):
        for i in range(1, len(tape)):
            before[(t, i)].add((t, i - 1))
    _seen_elsewhere(clocks, names, before)
    _handoffs_in_order(tapes, names, before)
    if learners_in_order:
        _learners_in_order(tapes, before)
    return _topological(tapes, before)


def _clock(index: int, record: Mapping[str, Any]) -> dict[str, int]:
    if "vclock" not in record:
        return {}
    try:
        return vclock.validate(record["vclock"])
    except ValueError as exc:
        raise TapeError(f"record {index + 1} of a tape: {exc}") from None


def _seen_elsewhere(clocks: list[list[dict[str, int]]], names: Sequence[str], before: dict[Position, set[Position]]) -> None:
    """A record follows, on every other shard's tape, the last record its clock has seen there."""
    own: list[list[int]] = []  # tape t's own clock entry at each record (carried over records without a clock)
    for t, tape in enumerate(clocks):
        running, column = 0, []
        for clock in tape:
            running = max(running, clock.get(names[t], 0))
            column.append(running)
        own.append(column)
    for t, tape in enumerate(clocks):
        for i, clock in enumerate(tape):
            for other, name in enumerate(names):
                seen = clock.get(name, 0)
                if other != t and seen > 0:
                    last = bisect.bisect_right(own[other], seen) - 1
                    if last >= 0:
                        before[(t, i)].add((other, last))


def _handoffs_in_order(
    tapes: Sequence[Sequence[Mapping[str, Any]]], names: Sequence[str], before: dict[Position, set[Position]]
) -> None:
    """A fragment is taken in after it was given away: the new owner installs what the old one exported."""
    out: dict[tuple[Any, Any], Position] = {}
    for t, tape in enumerate(tapes):
        for i, record in enumerate(tape):
            if record.get("type") == "handoff" and record.get("to") != names[t]:
                out[(record.get("fragment"), record.get("epoch"))] = (t, i)
    for t, tape in enumerate(tapes):
        for i, record in enumerate(tape):
            given = out.get((record.get("fragment"), record.get("epoch")))
            if record.get("type") == "handoff" and record.get("to") == names[t] and given is not None:
                before[(t, i)].add(given)


def _learners_in_order(tapes: Sequence[Sequence[Mapping[str, Any]]], before: dict[Position, set[Position]]) -> None:
    """Each learner's updates in the order it made them; its joins after its previous incarnations' updates."""
    updates: dict[str, list[tuple[int, int, Position]]] = defaultdict(list)
    joins: dict[str, list[tuple[int, Position]]] = defaultdict(list)
    for t, tape in enumerate(tapes):
        for i, record in enumerate(tape):
            if record.get("type") == "update":
                learner, incarnation, sequence = _update_id(record, i)
                updates[learner].append((incarnation, sequence, (t, i)))
            elif record.get("type") == "join":
                joins[str(record.get("learner"))].append((_count(record, "incarnation", i), (t, i)))
    for learner, made in updates.items():
        made.sort()
        for (_, _, earlier), (_, _, later) in zip(made, made[1:], strict=False):
            before[later].add(earlier)
        for incarnation, join in joins.get(learner, []):
            last = [position for inc, _, position in made if inc < incarnation]
            if last:
                before[join].add(last[-1])


def _update_id(record: Mapping[str, Any], index: int) -> tuple[str, int, int]:
    """An update id is LEARNER.INCARNATION.SEQUENCE (``train/learner.py``)."""
    parts = str(record.get("update_id", "")).rsplit(".", 2)
    if len(parts) != 3 or parts[0] != record.get("learner") or not all(p.isdigit() for p in parts[1:]):
        raise TapeError(f"record {index + 1} of a tape: update id {record.get('update_id')!r:.60} is not LEARNER.INCARNATION.N")
    return parts[0], int(parts[1]), int(parts[2])


def _count(record: Mapping[str, Any], key: str, index: int) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TapeError(f"record {index + 1} of a tape: {key} must be a non-negative integer, got {value!r:.40}")
    return value


def record_time(record: Mapping[str, Any]) -> float:
    """A record's ``t``; 0.0 for one that is missing or no finite number (a tape is a file: anything may be in it)."""
    t = record.get("t", 0.0)
    try:
        return float(t) if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) else 0.0
    except OverflowError:  # an integer too large for a float
        return 0.0


def _topological(tapes: Sequence[Sequence[Mapping[str, Any]]], before: dict[Position, set[Position]]) -> list[Position]:
    """Kahn's algorithm, the earliest (time, tape, index) first among the records whose predecessors are out."""
    after: dict[Position, list[Position]] = defaultdict(list)
    waiting = {(t, i): 0 for t, tape in enumerate(tapes) for i in range(len(tape))}
    for position, preds in before.items():
        waiting[position] = len(preds)
        for pred in preds:
            after[pred].append(position)
    ready = [(record_time(tapes[t][i]), t, i) for (t, i), n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order: list[Position] = []
    while ready:
        _, t, i = heapq.heappop(ready)
        order.append((t, i))
        for nxt in after[(t, i)]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                heapq.heappush(ready, (record_time(tapes[nxt[0]][nxt[1]]), *nxt))
    if len(order) != len(waiting):
        stuck = min(p for p, n in waiting.items() if n > 0)
        raise TapeError(
            f"the tapes contradict one another: record {stuck[1] + 1} of tape {stuck[0] + 1} waits on a record that waits on it "
            "(clocks, tape order and the learners' update ids cannot all hold); are they one run's tapes?"
        )
    return order


__all__ = ["Position", "causal_order", "record_time"]

"""A replayed learner's updates, made again in the order the learner made them, whatever order they arrived in.

A learner keeps several uploads in flight, and a queued update takes in a newer one of its fragment before it
is sent (``core/messages.absorb``). So a synchronizer's tape holds a learner's updates in the order they
*arrived*, some carrying others. Making an update moves the learner's reference point, so a replay must make
them in the learner's own order, which the update ids give (LEARNER.INCARNATION.N). The tape is indexed once;
an update that arrived before an earlier one makes the earlier ones first, and each is kept until the tape
delivers it. An update absorbed into a later one is made at its own step and added to it as the learner did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from ddctl.errors import ReplayDivergence
from ddctl_agents.core.messages import Adoption, Update, absorb, encode_update
from ddctl_agents.errors import TapeError
from ddctl_agents.train.learner import Learner

MAX_LOST = 4096
"""More ids than this on no tape before an update's own: not updates lost in flight but a number no learner made."""

CatchUp = Callable[[Learner, Sequence[Adoption], int, str], None]
"""Adopt these versions at their steps, then train up to the step: what a learner did before making an update."""


@dataclass(frozen=True, slots=True)
class Part:
    """One update id's place on the tape: the record that delivered it, and which of its absorbed updates (-1: its own)."""

    host: Mapping[str, Any]
    piece: int


class Remaker:
    """Makes each learner's updates in id order, hands out their frames as the tape delivers them."""

    def __init__(self, catch_up: CatchUp, codec: str, block: int) -> None:
        self.catch_up, self.codec, self.block = catch_up, codec, block
        self.parts: dict[str, Part] = {}
        self.next: dict[str, int] = {}
        """Per learner incarnation (LEARNER.INCARNATION), the id it makes next."""
        self.partial: dict[str, list[Update]] = {}
        self.waiting: dict[str, bytes] = {}
        """Frames made ahead of their arrival on the tape (an upload overtaken by a later one)."""
        self.lost = 0
        """Ids made by a learner that never reached a synchronizer (in flight when its process ended)."""

    def index(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Where every update id of the tapes is: its own record, or inside the record that absorbed it."""
        for record in records:
            if record.get("type") != "update":
                continue
            try:
                self.parts.setdefault(str(record["update_id"]), Part(record, -1))
                for i, (uid, _, _) in enumerate(record.get("absorbed", [])):
                    self.parts.setdefault(str(uid), Part(record, i))
            except (KeyError, TypeError, ValueError) as exc:  # a tape is a file: anything may be in it
                what = f"update {record.get('update_id')!r:.60}"
                raise TapeError(f"{what}: a malformed update record ({type(exc).__name__})") from None

    def frame(self, learner: Learner, record: Mapping[str, Any], where: str) -> bytes:
        """The frame of ``record``'s update: made now (with every earlier one of its learner), or earlier and kept.

        A retried upload is never on a tape twice: the synchronizer answers it duplicate and records nothing."""
        uid = str(record["update_id"])
        prefix, _, number = uid.rpartition(".")
        if prefix != f"{learner.name}.{learner.incarnation}" or not number.isdigit():
            raise ReplayDivergence(f"{where}: update id {uid!r:.60} is not {learner.name}.{learner.incarnation}.N")
        self.parts.setdefault(uid, Part(record, -1))  # a record fed without an index
        if int(number) - self.next.get(prefix, 0) > len(self.parts) + MAX_LOST:
            raise ReplayDivergence(f"{where}: update id {uid!r:.60} is more than {MAX_LOST} past any update on the tapes")
        while uid not in self.waiting:
            q = self.next.get(prefix, 0)
            if q > int(number):
                raise ReplayDivergence(f"{where}: update {uid} is on the tape twice (a synchronizer tapes each id once)")
            self._make(learner, f"{prefix}.{q}", where)
            self.next[prefix] = q + 1
        return self.waiting.pop(uid)

    def _make(self, learner: Learner, uid: str, where: str) -> None:
        part = self.parts.get(uid)
        if part is None:  # on no tape: it died in flight with its learner, whose later updates may still match
            learner.skip_update_id()
            self.lost += 1
            return
        host = part.host
        absorbed = [(str(a[0]), int(a[1]), int(a[2])) for a in host.get("absorbed", [])]
        start = sum(n for _, _, n in absorbed[: part.piece if part.piece >= 0 else len(absorbed)])
        if part.piece >= 0:
            _, step, count = absorbed[part.piece]
            adoptions = host["adoptions"][start : start + count]
        else:
            step, adoptions = int(host["step"]), host["adoptions"][start:]
        self.catch_up(learner, [(int(p), int(v), int(s)) for p, v, s in adoptions], step, where)
        fragment = int(host["fragment"])
        state = learner.state[fragment]
        if state.version < 0 or state.c_steps == 0:  # the tape's order cannot be the run's: nothing to send here
            raise ReplayDivergence(f"{where}: {learner.name} has no drift of fragment {fragment} to send as {uid}")
        update = learner.make_update(fragment)
        if update.update_id != uid:
            raise ReplayDivergence(f"{where}: {learner.name} made update {update.update_id} where the tape has {uid}")
        host_id = str(host["update_id"])
        if part.piece >= 0:
            self.partial.setdefault(host_id, []).append(update)
            return
        whole = reduce(absorb, [*self.partial.pop(host_id, []), update])
        made = (whole.c_steps, whole.c_tokens, [a[0] for a in whole.absorbed])
        if made != (host["c_steps"], host["c_tokens"], [a[0] for a in absorbed]):
            raise ReplayDivergence(f"{where}: replayed update {host_id} does not match the tape")
        self.waiting[host_id] = encode_update(whole, self.codec, self.block)

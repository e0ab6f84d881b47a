"""Which fragment versions a learner that sends every k-th period is sent.

A learner at cadence k > 1 is on a link too slow for every version of every
fragment (docs/design.md, "Cadence"): it is sent a fragment's first version
(bootstrap), then one version per update of that fragment it pushes, the
first that can hold that update (newer than the version its push was answered
with). A push that was dropped as too stale is answered with the current
version at once: the learner resyncs from it. Everything else is held back,
so its downlink carries 1/k of the versions, each the one it will adopt.

Not durable: after a restart a held learner gets the version owed for its next
push; until then its schedule (a send k*H steps after the last) keeps it going.
"""

from __future__ import annotations

from ddctl_agents.core.effects import Ack


class Holds:
    def __init__(self) -> None:
        self._owed: dict[str, dict[int, int]] = {}
        """Held learner -> fragment -> send the first version newer than this."""

    def joined(self, learner: str, cadence: int) -> None:
        if cadence > 1:
            self._owed.setdefault(learner, {})
        else:
            self._owed.pop(learner, None)

    def pushed(self, learner: str, fragment: int, ack: Ack, newest: int = -1) -> bool:
        """Record what ``learner`` is owed for its push: the first version newer than the one it was answered with
        (the current one if the push was dropped as too stale). True when that exists already (``newest``, the
        version published now, is newer), so its stream must look again: a resync, or a round closed meanwhile."""
        owed = self._owed.get(learner)
        if owed is None or ack.status == "rejected":
            return False
        owed[fragment] = ack.version - 1 if ack.status == "dropped" else ack.version
        return newest > owed[fragment]

    def wants(self, learner: str, fragment: int, version: int, seen: int) -> bool:
        """Whether the stream sends ``learner`` this version, which is newer than the ``seen`` one it holds."""
        owed = self._owed.get(learner)
        if owed is None or seen < 0:
            return True
        after = owed.get(fragment)
        return after is not None and version > after

    def sent(self, learner: str, fragment: int) -> None:
        owed = self._owed.get(learner)
        if owed is not None:
            owed.pop(fragment, None)

    def held(self, learner: str) -> bool:
        return learner in self._owed

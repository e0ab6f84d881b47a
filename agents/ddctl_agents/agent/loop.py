"""The learner's step loop, the same for one rank and for many.

Each step, the leader looks at what arrived from the synchronizer and whether
to stop, and starts broadcasting that decision (``ranks.Decisions``); every rank
then takes the step, finishes the sends started after the previous step (their
snapshots copied to the host while this step computed), reads the decision and
applies it: the same fragment versions are adopted between the same two steps
on every rank, and all ranks stop together. Due fragments then start their
sends. With one rank the decision is local, but the order is the same, which is
what lets a 2-rank learner be compared step for step with a 1-rank one.

``Leader`` is whatever carries updates and fragment versions for rank 0: the
HTTP/2 comms in a real run, something local in a test or a benchmark.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from ddctl_agents.agent.subscription import Subscriber, fits, implausible
from ddctl_agents.core import vclock
from ddctl_agents.core.messages import FragmentVersion, Update
from ddctl_agents.core.text import printable
from ddctl_agents.errors import WireError
from ddctl_agents.train.learner import Learner, PendingSend
from ddctl_agents.train.ranks import Decisions

log = logging.getLogger(__name__)

REPORT_EVERY = 10
"""Read the loss (a host sync on accelerators, an all-reduce across ranks) once every this many steps."""

GO, STOP, STOP_NOW = 0, 1, 2
"""The first integer of a decision: train on; stop after pushing what is pending; stop without it."""


def most_ahead(learner: Learner) -> int:
    """The most rounds a fragment's version can move past the one held within this job: a round takes an update, and
    each of at most ``MOST_LEARNERS`` learners sends a fragment at most once per step it trains, plus its last flush.
    A number beyond it no job of this length produces, however long the learner was cut off."""
    return vclock.MOST_LEARNERS * (learner.total_steps + 2)


class Leader(Protocol):
    """Rank 0's link to the synchronizer."""

    def arrivals(self) -> list[FragmentVersion]: ...

    def send(self, update: Update) -> None: ...


@dataclass(slots=True)
class Outcome:
    """How a loop ended, for the learner's summary."""

    reason: str | None = None
    """The leader's stop reason; None when the budget was reached (or on the other ranks)."""
    code: int = GO
    loss: float | None = None
    adoptions: list[tuple[int, int, int]] = field(default_factory=list)
    """(fragment, version, step) of every adoption, bootstrap included: equal on every rank."""


class StepLoop:
    """See the module docstring. ``should_stop`` (leader only) answers (code, reason) or None."""

    def __init__(
        self,
        learner: Learner,
        decisions: Decisions,
        leader: Leader | None,
        should_stop: Callable[[], tuple[int, str] | None] = lambda: None,
    ) -> None:
        self.learner, self.decisions, self.leader, self.should_stop = learner, decisions, leader, should_stop
        self.outcome = Outcome()
        self._held: dict[int, FragmentVersion] = {}
        self._pending: list[PendingSend] = []
        self.refused = 0
        """Arrived versions refused before adoption (``_collect``)."""
        subscriber = getattr(leader, "subscriber", None)  # the comms' (agent/comm.py): refuse such versions at the stream
        if isinstance(subscriber, Subscriber):
            subscriber.expect(learner.fragmentation.fragments, most_ahead(learner))

    def bootstrap(self, wait: Callable[[], None]) -> bool:
        """Adopt every fragment's current version on every rank; False if told to stop first."""
        decision: list[int] | None = None
        if self.leader is not None:
            while True:
                self._collect()
                stop = self.should_stop()
                if stop is not None:
                    self.outcome.reason, self.outcome.code = stop[1], stop[0]
                    decision = [stop[0]]
                    break
                if len(self._held) == self.learner.fragmentation.count:
                    decision = [GO, *self._plan()]
                    break
                wait()
        self.decisions.start(decision)
        return self._apply(self.decisions.result())

    def run(self, budget: int, on_step: Callable[[Tensor, float | None], None] = lambda loss, value: None) -> Outcome:
        """Train until ``budget`` (the same on every rank) or a stop decision; ``on_step`` after each step."""
        learner = self.learner
        while learner.step < budget:
            decision = None
            if self.leader is not None:
                self._collect()
                stop = self.should_stop()
                if stop is not None:
                    self.outcome.reason = stop[1]
                decision = [stop[0] if stop else GO, *self._plan()]
            self.decisions.start(decision)
            loss = learner.train_step()
            self._finish_sends()
            going = self._apply(self.decisions.result())
            for p in learner.due():
                if learner.has_drift(p):
                    self._pending.append(learner.begin_send(p))
            value = learner.trainer.loss_mean(loss) if learner.step % REPORT_EVERY == 0 else None
            if value is not None:
                self.outcome.loss = value
            on_step(loss, value)
            if not going:
                break
        self._finish_sends()
        return self.outcome

    def flush(self) -> None:
        """Send every fragment's unsent drift (every rank takes part: a sharded model gathers)."""
        if self.outcome.code == STOP_NOW:
            return
        for p, s in enumerate(self.learner.state):
            if self.learner.has_drift(p) and s.version >= 0:
                self._pending.append(self.learner.begin_send(p))
        self._finish_sends()

    def _collect(self) -> None:
        """Leader: keep the newest arrived version of each fragment until it is adopted."""
        assert self.leader is not None
        for message in self.leader.arrivals():
            if why := self._unfit(message):
                self.refused += 1
                log.warning("refused version %s of fragment %s: %s", message.version, message.fragment, printable(why))
                continue
            held = self._held.get(message.fragment)
            if message.version > self.learner.state[message.fragment].version and (
                held is None or message.version > held.version
            ):
                self._held[message.fragment] = message

    def _unfit(self, message: FragmentVersion) -> str:
        """Why ``message`` cannot be adopted (not this job's fragment, other tensors, numbered implausibly far ahead),
        or "": whatever the leader hands over, adopting it must not end the loop or freeze the fragment."""
        learner = self.learner
        if not 0 <= message.fragment < learner.fragmentation.count:
            return f"this job's fragments are 0 to {learner.fragmentation.count - 1}"
        try:
            fits(message, learner.fragmentation.fragments[message.fragment])
        except WireError as exc:
            return str(exc)
        return implausible(learner.state[message.fragment].version, message.version, most_ahead(learner))

    def _plan(self) -> list[int]:
        return [value for p in sorted(self._held) for value in (p, self._held[p].version)]

    def _apply(self, decision: list[int]) -> bool:
        """Adopt what the decision names; False when it says stop."""
        code, pairs = decision[0], decision[1:]
        for p, version in zip(pairs[::2], pairs[1::2], strict=True):
            message = self._held.pop(p) if self.leader is not None else FragmentVersion(fragment=p, version=version, tensors={})
            update = self.learner.on_arrival(message)
            if update is not None and self.leader is not None:
                self.leader.send(update)
            self.outcome.adoptions.append((p, version, self.learner.step))
        if code != GO:
            self.outcome.code = code
        return code == GO

    def _finish_sends(self) -> None:
        for pending in self._pending:
            update = self.learner.finish_send(pending)
            if update is not None and self.leader is not None:
                self.leader.send(update)
        self._pending.clear()


__all__ = ["GO", "REPORT_EVERY", "STOP", "STOP_NOW", "Leader", "Outcome", "StepLoop"]

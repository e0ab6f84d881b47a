"""A job whose other learners all finished while one was given up ends with their work, not waiting for ever.

A given-up learner (``reconcile``: its agent kept ending soon after each start) never trains its share, and
a synchronizer ends a job only once every learner slot has finished. So once every other learner has, the
controller asks each synchronizer process to stop, as ``ddctl stop`` does: the job ends with the work the
others did, its result is recorded and the machines go (unless the run keeps them), instead of a synchronizer
left running (and paid for) with nothing to wait for but a learner that will not come.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ddctl.control.rundir import RunDir
from ddctl.control.state import GIVEN_UP, InstanceRecord, State
from ddctl_agents.errors import PeerError

log = logging.getLogger("ddctl.controller")

Ask = Callable[[str, str, str], bool]
"""(run, url, reason) -> whether that synchronizer began ending the job (``finish.ask_to_stop``)."""


def waiting_only_for_given_up(records: Iterable[InstanceRecord]) -> list[str]:
    """The given-up learners, if every other learner has finished; else none (the job still has work going on).

    A learner over several VMs is one: given up if any of its VMs' records says so, finished if all of them do."""
    states: dict[str, set[str]] = {}
    for r in records:
        if r.role == "learner":
            states.setdefault(str(r.detail.get("learner") or r.name), set()).add(r.state)
    given_up = sorted(name for name, seen in states.items() if GIVEN_UP in seen)
    finished = all(seen == {"finished"} for name, seen in states.items() if name not in given_up)
    return given_up if given_up and finished else []


@dataclass
class EndWithoutGivenUp:
    """Asks each synchronizer process to stop once the job waits only for given-up learners; a process that does not
    answer is asked again on the next pass."""

    ask: Ask
    asked: set[str] = field(default_factory=set)

    def once(self, run: str, state: State, records: Iterable[InstanceRecord]) -> None:
        given_up = waiting_only_for_given_up(records)
        if not given_up:
            return
        reason = f"{', '.join(given_up)} given up (see the event log); every other learner finished its share"
        try:
            urls = RunDir(run).urls()
        except OSError as exc:  # the run's directory lost its addresses: said, and looked for again next pass
            log.warning("the job waits only for %s, but its synchronizer's address is unknown: %s", given_up, exc)
            return
        for url in urls:
            if url in self.asked:
                continue
            try:
                self.ask(run, url, reason)
            except (PeerError, OSError) as exc:  # unreachable now, or refused: asked again on the next pass
                log.warning("asking %s to end the job: %s", url, exc)
                continue
            if not self.asked:
                state.event(run, "stop", reason=reason)
            self.asked.add(url)

"""The learner's progress lines: what ``ddctl logs`` shows while a learner trains.

Without them a learner's log stays empty until its exit summary, so nobody can
tell a slow learner from a stuck one. ``Progress.observe`` is pure: the training
loop feeds it a ``ProgressSample`` (time as an argument) after every step and it
answers with the lines that are due: an INFO line at the first step and then
every ``every_s`` seconds (step/total, loss, tokens/s, sends, adoptions, bytes),
and a WARNING when the syncer starts refusing updates or stops answering (with
an INFO line when it answers again). ``report`` and ``finish`` are the thin
shell that samples the learner and its comms and logs those lines. ``Pace`` keeps
the step times and the last loss that heartbeats and the summary report.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddctl_agents.agent.comm import Comms
    from ddctl_agents.train.learner import Learner

log = logging.getLogger(__name__)
EVERY_S = 10.0
"""Seconds between two progress lines."""
SILENT_WARN_S = 15.0
"""Warn once the syncer has not answered this long (the comms keep retrying on their own)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressSample:
    """What the learner knows about itself after one step."""

    step: int
    loss: float | None
    tokens_per_s: float
    sent_tokens: int
    """Fragment-tokens handed to the uploaders."""
    acked_tokens: int
    """Fragment-tokens the syncer acknowledged (accepted, late, dropped or duplicate)."""
    rejected_tokens: int
    """Fragment-tokens the syncer refused with a 4xx."""
    bytes_up: int
    bytes_down: int
    versions: tuple[int, ...]
    """Each fragment's adopted version (-1 before its bootstrap)."""
    silent_s: float
    """Seconds since the syncer last answered anything."""


@dataclass(frozen=True, slots=True)
class ProgressLine:
    level: int
    text: str


def _si(value: float) -> str:
    """1234567 -> '1.23M': short enough for a line that is read by eye."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}" if isinstance(value, float) and not value.is_integer() else str(int(value))


class Progress:
    """Decides when a progress line is due and what it says; keeps the counts between lines."""

    def __init__(self, *, total: int, every_s: float = EVERY_S, silent_warn_s: float = SILENT_WARN_S) -> None:
        self.total, self.every_s, self.silent_warn_s = total, every_s, silent_warn_s
        self.adopted = 0
        """Fragment versions adopted since the first sample (the bootstrap's are not counted)."""
        self._versions: tuple[int, ...] | None = None
        self._next_at: float | None = None
        self._rejected = 0
        self._silent = False

    def observe(self, now: float, sample: ProgressSample) -> list[ProgressLine]:
        """The lines due after this step (usually none)."""
        if self._versions is not None:
            self.adopted += sum(new > old for new, old in zip(sample.versions, self._versions, strict=False))
        self._versions = sample.versions
        lines = self._warnings(sample)
        if self._next_at is None or now >= self._next_at:
            self._next_at = now + self.every_s
            lines.append(ProgressLine(logging.INFO, self.describe(sample)))
        return lines

    def describe(self, sample: ProgressSample) -> str:
        """One line: ``step 120/2000 (6.0%) loss 2.345 tokens/s 12.3k sent 1.2M acked 1.1M adopted 14 ...``."""
        share = f" ({100.0 * sample.step / self.total:.1f}%)" if self.total > 0 else ""
        loss = "-" if sample.loss is None else f"{sample.loss:.4f}"
        return (
            f"step {sample.step}/{self.total}{share} loss {loss} tokens/s {_si(sample.tokens_per_s)}"
            f" sent {_si(sample.sent_tokens)} acked {_si(sample.acked_tokens)} tokens"
            f" adopted {self.adopted} up {_si(sample.bytes_up)}B down {_si(sample.bytes_down)}B"
        )

    def _warnings(self, sample: ProgressSample) -> list[ProgressLine]:
        lines = []
        if sample.rejected_tokens > self._rejected:
            lines.append(
                ProgressLine(
                    logging.WARNING,
                    f"the syncer refused {_si(sample.rejected_tokens - self._rejected)} fragment-tokens of updates"
                    f" ({_si(sample.rejected_tokens)} so far); they are not applied",
                )
            )
            self._rejected = sample.rejected_tokens
        if sample.silent_s >= self.silent_warn_s and not self._silent:
            self._silent = True
            lines.append(
                ProgressLine(
                    logging.WARNING, f"no answer from the syncer for {sample.silent_s:.0f} s; retrying (training goes on)"
                )
            )
        elif sample.silent_s < self.silent_warn_s and self._silent:
            self._silent = False
            lines.append(ProgressLine(logging.INFO, "the syncer answers again"))
        return lines

    # -- the shell: sample the learner and its comms, log the lines ----------------------------
    def report(self, now: float, learner: Learner, comms: Comms) -> None:
        """Called by the training loop after every step; logs what is due."""
        for line in self.observe(now, sample_of(now, learner, comms)):
            log.log(line.level, "%s", line.text)

    def finish(self, now: float, learner: Learner, comms: Comms, reason: str) -> None:
        """The last line, whatever the time: where training stopped and why."""
        sample = sample_of(now, learner, comms)
        for line in self._warnings(sample):
            log.log(line.level, "%s", line.text)
        log.info("stopped (%s): %s", reason, self.describe(sample))


def sample_of(now: float, learner: Learner, comms: Comms) -> ProgressSample:
    """What ``comms.report`` (the heartbeat the loop just set) and the ledgers say now."""
    report, ledger = comms.report, comms.ledger
    loss = report.get("loss")
    return ProgressSample(
        step=learner.step,
        loss=None if loss is None else float(loss),
        tokens_per_s=float(report.get("tokens_per_s") or 0.0),
        sent_tokens=ledger.sent,
        acked_tokens=ledger.acked_total(),
        rejected_tokens=ledger.rejected,
        bytes_up=ledger.bytes_up,
        bytes_down=ledger.bytes_down,
        versions=tuple(s.version for s in learner.state),
        silent_s=max(0.0, now - comms.last_contact),
    )


@dataclass(slots=True)
class Pace:
    """Step times, training seconds, the last loss read and the step of the last adoption, for reports."""

    tick: float
    last_adopt: int
    train_s: float = 0.0
    loss: float | None = None
    adopted: int = 0
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=16))

    def stepped(self, now: float, loss: float | None, adopted: int, step: int) -> None:
        self.step_times.append(now - self.tick)
        self.train_s += now - self.tick
        self.tick = now
        if loss is not None:
            self.loss = loss
        if adopted != self.adopted:
            self.adopted, self.last_adopt = adopted, step

"""The synchronizer as a sans-I/O state machine.

It holds the global fragments, their outer-optimiser state and versions, the
learner registry and the token ledger. The shell (virtual cluster, replay, the
HTTP/2 service) feeds it events with the current time and carries out the
effects it returns: ``Send`` a fragment version to learners, ``Record`` an
entry on the event tape. Nothing here sleeps, reads a clock or touches a
socket, so a run is a deterministic function of its event sequence.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ddctl_agents.core import schedule, vclock
from ddctl_agents.core.codec import all_finite
from ddctl_agents.core.fragments import Fragmentation
from ddctl_agents.core.ledger import TokenLedger
from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.core.merge import MERGES, Contribution, merge_fragment
from ddctl_agents.core.messages import FragmentVersion, Update
from ddctl_agents.core.outer import OuterConfig, outer_step
from ddctl_agents.core.quorum import QuorumConfig, RoundView, Timing, decide_round
from ddctl_agents.errors import BadUpdate, ConfigError, ImpossibleVersion, NonFiniteUpdate, UnknownLearner


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncerConfig:
    """Everything that shapes the syncer's decisions."""

    quorum: QuorumConfig = field(default_factory=QuorumConfig)
    outer: OuterConfig = field(default_factory=OuterConfig)
    merge: str = "rda"
    inner_steps: int = 24
    """H, needed to forecast when an absent learner's update is due."""
    max_behind: int = 1
    """[ours] Late updates at most this many versions behind fold into the next round."""

    def __post_init__(self) -> None:
        if self.merge not in MERGES:
            raise ConfigError(f"merge must be one of {', '.join(MERGES)}, got {self.merge!r}")
        if self.max_behind < 0:
            raise ConfigError(f"max_behind must be >= 0, got {self.max_behind}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """Deliver ``message`` to each learner in ``to``."""

    to: tuple[str, ...]
    message: FragmentVersion
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One entry for the event tape."""

    entry: dict[str, Any]


Effect = Send | Record


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """What the learner is told about its update."""

    status: str  # accepted | late | dropped | duplicate
    reason: str
    version: int


@dataclass(slots=True)
class _RecentIds:
    """A learner's last ``size`` update ids: retries arrive soon after the original, so a
    bounded window per learner deduplicates them without growing with the run."""

    size: int = 4096
    order: deque[str] = field(default_factory=deque)
    ids: set[str] = field(default_factory=set)

    def __contains__(self, update_id: object) -> bool:
        return update_id in self.ids

    def add(self, update_id: str) -> None:
        self.order.append(update_id)
        self.ids.add(update_id)
        if len(self.order) > self.size:
            self.ids.discard(self.order.popleft())


@dataclass(slots=True)
class _Round:
    opened_at: float | None = None
    quorum_met_at: float | None = None
    wake_at: float | None = None
    fresh: dict[str, Contribution] = field(default_factory=dict)
    late: dict[str, Contribution] = field(default_factory=dict)
    upload_bytes: int = 0


class Synchronizer:
    """Global state plus the rules that change it; see the module docstring."""

    def __init__(
        self, params: Mapping[str, torch.Tensor], fragmentation: Fragmentation, embeddings: frozenset[str], config: SyncerConfig
    ) -> None:
        self.config = config
        self.fragmentation = fragmentation
        self.embeddings = embeddings
        self.fragments = [{t.name: params[t.name].detach().float().clone() for t in frag} for frag in fragmentation.fragments]
        self.buffers: list[dict[str, torch.Tensor]] = [{} for _ in fragmentation.fragments]
        self.versions = [0] * fragmentation.count
        self.rounds = [_Round() for _ in fragmentation.fragments]
        self.live: dict[str, int] = {}
        self.links: dict[str, LearnerLinks] = {}
        self.ledger = TokenLedger()
        self.clock: dict[str, int] = {vclock.SYNCER: 0}
        self.seen_updates: dict[str, _RecentIds] = {}
        self.rounds_closed = 0

    # -- registry ---------------------------------------------------------------------------
    def register(self, now: float, learner: str, incarnation: int = 0, start_step: int = 0) -> list[Effect]:
        """A learner joins (or rejoins) at ``start_step``: it gets every current fragment to bootstrap from."""
        self.live[learner] = incarnation
        self.links.setdefault(learner, LearnerLinks())
        self.clock = vclock.tick(self.clock, vclock.SYNCER)
        effects: list[Effect] = [self._record(now, "join", learner=learner, incarnation=incarnation, start_step=start_step)]
        effects += [
            Send(to=(learner,), message=self.fragment_message(p), reason="bootstrap") for p in range(self.fragmentation.count)
        ]
        return effects

    def deregister(self, now: float, learner: str, reason: str) -> list[Effect]:
        """A learner left or was declared dead; its acknowledged updates stay in their rounds.

        Like ``receive`` it never closes a round: the shell calls ``poll`` next.
        """
        if self.live.pop(learner, None) is None:
            return []
        self.clock = vclock.tick(self.clock, vclock.SYNCER)
        return [self._record(now, "leave", learner=learner, reason=reason)]

    def heartbeat(self, now: float, learner: str, step: int, step_time: float, due: tuple[int, ...] = ()) -> None:
        """Progress report: step, median step time and, optionally, each fragment's next due step."""
        self._links(learner).pace.observe(now, step, step_time, due)

    def observe_upload(self, learner: str, nbytes: int, seconds: float, rtt_s: float | None = None) -> None:
        self._links(learner).up.observe(nbytes, seconds, rtt_s)

    def observe_download(self, learner: str, nbytes: int, seconds: float) -> None:
        self._links(learner).down.observe(nbytes, seconds)

    def observe_inflight(self, now: float, learner: str, fragment: int, received: int, expected: int | None) -> None:
        """Progress of an upload still arriving (``expected`` None: it ended or failed)."""
        inflight = self._links(learner).inflight
        if expected is None:
            inflight.pop(fragment, None)
        else:
            inflight[fragment] = (now, received, expected)

    # -- updates ----------------------------------------------------------------------------
    def receive(self, now: float, update: Update, nbytes: int = 0) -> tuple[Ack, list[Effect]]:
        """Acknowledge an update into a round (fresh or late), or drop it; never closes a round."""
        self._validate(update)
        p, current = update.fragment, self.versions[update.fragment]
        recent = self.seen_updates.setdefault(update.learner, _RecentIds())
        if update.update_id in recent:
            return Ack(status="duplicate", reason="update id already applied", version=current), []
        recent.add(update.update_id)
        self.clock = vclock.receive(self.clock, update.vclock, vclock.SYNCER)
        self.heartbeat(now, update.learner, update.step, update.step_time)
        units = update.c_tokens
        self.ledger.received += units
        behind = current - update.base_version
        contribution = Contribution(
            learner=update.learner, tensors=update.tensors, c_steps=update.c_steps, c_tokens=update.c_tokens
        )
        rnd = self.rounds[p]
        if behind > self.config.max_behind:
            self.ledger.dropped += units
            ack = Ack(
                status="dropped",
                reason=f"base version {update.base_version} is {behind} behind {current}; resync",
                version=current,
            )
            resync = Send(to=(update.learner,), message=self.fragment_message(p), reason="resync")
            return ack, [self._update_record(now, update, ack), resync]
        self.ledger.pending += units
        if behind == 0:
            rnd.fresh[update.learner] = _accumulate(rnd.fresh.get(update.learner), contribution)
            rnd.upload_bytes = max(rnd.upload_bytes, nbytes)
            if rnd.opened_at is None:
                rnd.opened_at = now
            ack = Ack(status="accepted", reason=f"in round {current + 1} of fragment {p}", version=current)
        else:
            rnd.late[update.learner] = _accumulate(rnd.late.get(update.learner), contribution)
            ack = Ack(
                status="late",
                reason=f"base {update.base_version} is {behind} behind; folded into round {current + 1}",
                version=current,
            )
        return ack, [self._update_record(now, update, ack)]

    def poll(self, now: float) -> list[Effect]:
        """Ask the quorum/grace decision about every open round; close those it allows."""
        effects: list[Effect] = []
        for p, rnd in enumerate(self.rounds):
            if not self.live and (rnd.fresh or rnd.late):  # nobody left to wait for: merge what arrived
                effects += self.close_round(now, p, "final_drain", "no live learners remain; merging what arrived")
                continue
            if rnd.opened_at is None:
                continue
            view = RoundView(
                opened_at=rnd.opened_at, arrived=frozenset(rnd.fresh), live=frozenset(self.live), quorum_met_at=rnd.quorum_met_at
            )
            decision = decide_round(now, view, self._timing(now, p), self.config.quorum)
            if rnd.quorum_met_at is None and (decision.close or decision.wake_at is not None):
                rnd.quorum_met_at = now
            rnd.wake_at = decision.wake_at
            if decision.close:
                effects += self.close_round(now, p, decision.cause, decision.reason, decision.grace_s)
        return effects

    def next_wake(self) -> float | None:
        wakes = [r.wake_at for r in self.rounds if r.wake_at is not None]
        return min(wakes) if wakes else None

    def close_round(self, now: float, p: int, cause: str, reason: str, grace_s: float = 0.0) -> list[Effect]:
        """Merge the round's contributions, take the outer step, broadcast the new version."""
        rnd = self.rounds[p]
        contributions = _by_learner(rnd)
        if not contributions:
            raise BadUpdate(f"fragment {p} has no contributions to close a round with")
        delta = merge_fragment(contributions, self.embeddings, self.config.merge)
        self.fragments[p], self.buffers[p] = outer_step(self.fragments[p], delta, self.buffers[p], self.config.outer)
        fresh_units = sum(c.c_tokens for c in rnd.fresh.values())
        late_units = sum(c.c_tokens for c in rnd.late.values())
        self.ledger.merged += fresh_units
        self.ledger.late_merged += late_units
        self.ledger.pending -= fresh_units + late_units
        self.versions[p] += 1
        self.rounds_closed += 1
        self.rounds[p] = _Round()
        self.clock = vclock.tick(self.clock, vclock.SYNCER)
        admitted = [
            {
                "learner": c.learner,
                "late": c.learner in rnd.late and c.learner not in rnd.fresh,
                "c_steps": c.c_steps,
                "c_tokens": c.c_tokens,
                "weight": c.weight,
            }
            for c in sorted(contributions, key=lambda c: c.learner)
        ]
        record = self._record(
            now,
            "round",
            fragment=p,
            version=self.versions[p],
            cause=cause,
            reason=reason,
            grace_s=round(grace_s, 6),
            admitted=admitted,
            opened_at=rnd.opened_at,
        )
        return [record, Send(to=tuple(sorted(self.live)), message=self.fragment_message(p), reason="round")]

    # -- views ------------------------------------------------------------------------------
    def fragment_message(self, p: int) -> FragmentVersion:
        return FragmentVersion(fragment=p, version=self.versions[p], tensors=self.fragments[p], vclock=dict(self.clock))

    def global_params(self) -> dict[str, torch.Tensor]:
        return {name: t for frag in self.fragments for name, t in frag.items()}

    def open_rounds(self) -> list[int]:
        return [p for p, r in enumerate(self.rounds) if r.fresh or r.late]

    # -- internals --------------------------------------------------------------------------
    def _links(self, learner: str) -> LearnerLinks:
        return self.links.setdefault(learner, LearnerLinks())

    def _validate(self, update: Update) -> None:
        if update.learner not in self.live:
            raise UnknownLearner(f"learner {update.learner!r} is not registered")
        if not 0 <= update.fragment < self.fragmentation.count:
            raise BadUpdate(f"fragment {update.fragment} out of range [0, {self.fragmentation.count})")
        current = self.versions[update.fragment]
        if update.base_version > current:
            raise ImpossibleVersion(
                f"base version {update.base_version} of fragment {update.fragment} is ahead of the syncer's {current}"
            )
        if update.c_steps < 1 or update.c_tokens < 1:
            raise BadUpdate(f"c_steps and c_tokens must be >= 1, got {update.c_steps}/{update.c_tokens}")
        expected = self.fragments[update.fragment]
        if set(update.tensors) != set(expected):
            raise BadUpdate(f"fragment {update.fragment} holds {sorted(expected)}, update has {sorted(update.tensors)}")
        for name, t in update.tensors.items():
            if t.numel() != expected[name].numel():
                raise BadUpdate(f"tensor {name!r} has {t.numel()} elements, expected {expected[name].numel()}")
            if not all_finite(t.reshape(-1)):
                raise NonFiniteUpdate(f"tensor {name!r} contains NaN or Inf")

    def _timing(self, now: float, p: int) -> Timing:
        rnd = self.rounds[p]
        arrived = [self._links(m).pace.step_time for m in rnd.fresh]
        known = [t for t in arrived if t is not None]
        step_time = min(known) if known else 0.0
        forecasts: dict[str, float] = {}
        for m in self.live:
            if m in rnd.fresh:
                continue
            links = self._links(m)
            due = (
                links.pace.due[p]
                if len(links.pace.due) > p
                else schedule.next_due_step(links.pace.last_step, p, self.fragmentation.count, self.config.inner_steps)
            )
            eta = links.predict_arrival(now, due, rnd.upload_bytes, p)
            if eta is not None:
                forecasts[m] = eta
        sync = [self._links(m).down.transfer_time(rnd.upload_bytes) for m in rnd.fresh]
        sync_time = max((s for s in sync if s is not None), default=0.0)
        return Timing(step_time=step_time, sync_time=sync_time, forecasts=forecasts)

    def _record(self, now: float, kind: str, **fields: Any) -> Record:
        return Record(entry={"type": kind, "t": _time(now), "vclock": dict(self.clock), **fields})

    def _update_record(self, now: float, update: Update, ack: Ack) -> Record:
        return self._record(
            now,
            "update",
            learner=update.learner,
            incarnation=update.incarnation,
            fragment=update.fragment,
            base_version=update.base_version,
            update_id=update.update_id,
            step=update.step,
            c_steps=update.c_steps,
            c_tokens=update.c_tokens,
            status=ack.status,
            adoptions=[list(a) for a in update.adoptions],
        )


def _accumulate(previous: Contribution | None, new: Contribution) -> Contribution:
    """Two updates of one learner for one round are consecutive drifts: add them."""
    if previous is None:
        return new
    tensors = {k: previous.tensors[k] + new.tensors[k] for k in new.tensors}
    return Contribution(
        learner=new.learner, tensors=tensors, c_steps=previous.c_steps + new.c_steps, c_tokens=previous.c_tokens + new.c_tokens
    )


def _by_learner(rnd: _Round) -> list[Contribution]:
    """One contribution per learner: a learner both late and fresh in a round counts once."""
    merged: dict[str, Contribution] = dict(rnd.late)
    for m, c in rnd.fresh.items():
        merged[m] = _accumulate(merged.get(m), c)
    return list(merged.values())


def _time(now: float) -> float:
    return round(now, 9) if math.isfinite(now) else now

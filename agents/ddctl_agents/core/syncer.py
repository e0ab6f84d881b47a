"""The synchronizer as a sans-I/O state machine.

It holds the global fragments, their outer-optimiser state and versions, the
learner registry, the quarantine and the token ledger. Updates are admitted
only after ``admission`` checks them, and a round publishes only a result that
passes its check (the trust boundary, docs/design.md). The shell (virtual
cluster, replay, the HTTP/2 service) feeds it events with the current time and
carries out the effects it returns (``core.effects``): ``Send`` a fragment
version to learners, ``Record`` an entry on the event tape, log a ``Fault``.
Nothing here sleeps, reads a clock or touches a
socket, so a run is a deterministic function of its event sequence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ddctl_agents.core import schedule, vclock
from ddctl_agents.core.admission import Rejection, UpdateLimits, admit_merge, check_update
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.core.effects import Ack, Effect, Fault, Record, Send
from ddctl_agents.core.ending import FINISHED
from ddctl_agents.core.forecast import round_timing
from ddctl_agents.core.fragments import Fragmentation
from ddctl_agents.core.fused_round import fused_outer_step
from ddctl_agents.core.ledger import TokenLedger
from ddctl_agents.core.links import LearnerLinks
from ddctl_agents.core.merge import Contribution, merge_fragment
from ddctl_agents.core.messages import FragmentVersion, Update
from ddctl_agents.core.outer import outer_step
from ddctl_agents.core.quarantine import Quarantine
from ddctl_agents.core.quorum import RoundDecision, RoundView, Timing, decide_round
from ddctl_agents.core.rounds import RecentIds, Round, accumulate
from ddctl_agents.core.text import clip
from ddctl_agents.errors import BadUpdate, ImpossibleVersion, Suspended, UnknownLearner


class Synchronizer:
    """Global state plus the rules that change it; see the module docstring."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        fragmentation: Fragmentation,
        embeddings: frozenset[str],
        config: SyncerConfig,
        limits: UpdateLimits | None = None,
        shard: tuple[str, tuple[str, ...]] = (vclock.SYNCER, ()),
    ) -> None:
        """``shard``: this process's vector-clock entry and its peer shards' (a sharded synchronizer), else ``syncer``."""
        self.config, (self.process, peers) = config, shard
        self.limits = limits or UpdateLimits()
        self.fragmentation = fragmentation
        self.embeddings = embeddings
        self.fragments = [{t.name: params[t.name].detach().float().clone() for t in frag} for frag in fragmentation.fragments]
        self.buffers: list[dict[str, torch.Tensor]] = [{} for _ in fragmentation.fragments]
        self.versions = [0] * fragmentation.count
        self.rounds = [Round() for _ in fragmentation.fragments]
        self.live: dict[str, int] = {}
        self.links: dict[str, LearnerLinks] = {}
        self.cadence: dict[str, int] = {}
        """Each learner's send cadence k (every k*H steps), as it registered; 1 if it never said."""
        self.ledger = TokenLedger()
        self.clock: dict[str, int] = {p: 0 for p in sorted({self.process, *peers, *([vclock.CUT] if peers else [])})}
        self.seen_updates: dict[str, RecentIds] = {}
        self.rounds_closed = 0
        self.quarantine = Quarantine(config.trust.max_rejections)
        self.degraded: dict[int, str] = {}
        """Fragments whose last round hit an unexpected error, with its reason (until a clean round)."""
        self.faults = [0] * fragmentation.count
        self.finished: set[str] = set()
        """Learners that left having trained their whole budget: the job ends when every one has."""

    # -- registry ---------------------------------------------------------------------------
    def register(self, now: float, learner: str, incarnation: int = 0, start_step: int = 0, cadence: int = 1) -> list[Effect]:
        """A learner joins (or rejoins) at ``start_step``, sending every ``cadence`` periods: it gets every
        current fragment to bootstrap from."""
        self.check_sender(learner)
        self.cadence[learner] = schedule.check_cadence(cadence)
        self.live[learner] = incarnation
        self.links.setdefault(learner, LearnerLinks())
        self.clock = vclock.tick(self.clock, self.process)
        joined = {"learner": learner, "incarnation": incarnation, "start_step": start_step, "cadence": cadence}
        effects: list[Effect] = [self._record(now, "join", **joined)]
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
        if reason == FINISHED:
            self.finished.add(learner)
        self.clock = vclock.tick(self.clock, self.process)
        return [self._record(now, "leave", learner=learner, reason=reason)]

    def heartbeat(self, now: float, learner: str, step: int, step_time: float, due: tuple[int, ...] = ()) -> None:
        """Progress report: step, median step time and, optionally, each fragment's next due step."""
        self._links(learner).pace.observe(now, step, step_time, due)

    def observe_link(self, learner: str, direction: str, nbytes: int, seconds: float, rtt_s: float | None = None) -> None:
        links = self._links(learner)
        (links.up if direction == "up" else links.down).observe(nbytes, seconds, rtt_s)

    def observe_inflight(self, now: float, learner: str, fragment: int, received: int, expected: int | None) -> None:
        """Progress of an upload still arriving (``expected`` None: it ended or failed)."""
        inflight = self._links(learner).inflight
        if expected is None:
            inflight.pop(fragment, None)
        else:
            inflight[fragment] = (now, received, expected)

    def cut(self, now: float, epoch: int, trigger: str) -> list[Effect]:
        """Chandy-Lamport colouring: from here this synchronizer's messages carry checkpoint epoch ``epoch``."""
        self.clock = vclock.tick({**self.clock, vclock.CUT: max(epoch, self.clock.get(vclock.CUT, 0))}, self.process)
        return [self._record(now, "cut", epoch=epoch, trigger=trigger)]

    # -- quarantine -------------------------------------------------------------------------
    def reject(self, now: float, learner: str, reason: str) -> list[Effect]:
        """Count a refused update (or a contribution set aside at a merge) against ``learner``; may suspend it."""
        if not self.quarantine.flag(learner, reason):
            return []
        effects = self.deregister(now, learner, "suspended")
        return [*effects, self._record(now, "suspend", learner=learner, reason=self.quarantine.suspension(learner))]

    def readmit(self, now: float, learner: str) -> list[Effect]:
        """An operator lets a suspended learner back in (it registers again); [] if it was not suspended."""
        if not self.quarantine.readmit(learner):
            return []
        self.clock = vclock.tick(self.clock, self.process)
        return [self._record(now, "readmit", learner=learner)]

    # -- updates ----------------------------------------------------------------------------
    def receive(self, now: float, update: Update, nbytes: int = 0) -> tuple[Ack, list[Effect]]:
        """Acknowledge an update into a round (fresh or late), drop it, or reject it; never closes a round.

        A rejected update (bad layout, NaN/Inf, implausible numbers) changes nothing but its
        sender's standing; it is answered with ``status="rejected"`` and the refusal's code.
        """
        self.check_sender(update.learner)
        if update.learner not in self.live:
            raise UnknownLearner(f"learner {update.learner!r} is not registered")
        p = update.fragment
        if not 0 <= p < self.fragmentation.count:
            return self._reject(
                now, update, Rejection("bad_update", f"fragment {p} out of range [0, {self.fragmentation.count})")
            )
        current = self.versions[p]
        if update.base_version > current:
            raise ImpossibleVersion(f"base version {update.base_version} of fragment {p} is ahead of the syncer's {current}")
        rejection = check_update(update, self.fragments[p], self.limits)
        if rejection is not None:
            return self._reject(now, update, rejection)
        recent = self.seen_updates.setdefault(update.learner, RecentIds())
        if update.update_id in recent:
            return Ack(status="duplicate", reason="update id already applied", version=current), []
        recent.add(update.update_id)
        # no made-up processes, the checkpoint epoch moves only at a cut (``cut``), and no learner knows more of this
        # process's events than it does: a learner can move none of these
        own = (vclock.CUT, self.process)
        known = {k: v for k, v in update.vclock.items() if k in self.clock and k not in own or k == update.learner}
        self.clock = vclock.receive(self.clock, known, self.process)
        self.heartbeat(now, update.learner, update.step, update.step_time)
        units = update.c_tokens
        self.ledger.received += units
        behind = current - update.base_version
        k = self.cadence.get(update.learner, 1)
        stale = behind if self.config.late_weight == "staleness" else 0
        contribution = Contribution(learner=update.learner, tensors=update.tensors, c_steps=update.c_steps,
                                    c_tokens=update.c_tokens, periods=k, stale=stale)  # fmt: skip
        rnd = self.rounds[p]
        allowed = k - 1 + self.config.max_behind * k  # sending every k periods, its base is k - 1 rounds old by design
        if behind > allowed:
            self.ledger.dropped += units
            ack = Ack(
                status="dropped",
                reason=f"base version {update.base_version} is {behind} behind {current} (at most {allowed}); resync",
                version=current,
            )
            resync = Send(to=(update.learner,), message=self.fragment_message(p), reason="resync")
            return ack, [self._update_record(now, update, ack), resync]
        self.ledger.pending += units
        if behind == 0:
            rnd.fresh[update.learner] = accumulate(rnd.fresh.get(update.learner), contribution)
            rnd.upload_bytes = max(rnd.upload_bytes, nbytes)
            if rnd.opened_at is None:
                rnd.opened_at = now
            ack = Ack(status="accepted", reason=f"in round {current + 1} of fragment {p}", version=current)
        else:
            rnd.late[update.learner] = accumulate(rnd.late.get(update.learner), contribution)
            ack = Ack(
                status="late",
                reason=f"base {update.base_version} is {behind} behind; folded into round {current + 1}",
                version=current,
            )
        return ack, [self._update_record(now, update, ack)]

    def poll(self, now: float) -> list[Effect]:
        """Ask the quorum/grace decision about every open round; close those it allows.

        An unexpected error in one fragment's round is a ``Fault``: that round is set
        aside (``discard_round``) and the other fragments go on.
        """
        effects: list[Effect] = []
        for p in range(self.fragmentation.count):
            try:
                effects += self._poll_fragment(now, p)
            except Exception as exc:  # noqa: BLE001 - a bug costs one round of one fragment, never the loop
                reason = clip(f"round of fragment {p} failed: {type(exc).__name__}: {exc}")  # its log record's bound
                effects += [*self.discard_round(now, p, reason), Fault(fragment=p, reason=reason, error=exc)]
        return effects

    def next_wake(self) -> float | None:
        wakes = [r.wake_at for r in self.rounds if r.wake_at is not None]
        return min(wakes) if wakes else None

    def close_round(self, now: float, p: int, cause: str, reason: str, grace_s: float = 0.0) -> list[Effect]:
        """Merge the round's contributions, take the outer step, broadcast the new version.

        A result that fails ``check_result`` is never committed: the contributions that
        caused it are set aside (tokens "rejected", counted against their learners) and
        the round is recomputed from the rest. If none is left the fragment keeps its version.
        """
        rnd = self.rounds[p]
        contributions = rnd.by_learner()
        if not contributions:
            raise BadUpdate(f"fragment {p} has no contributions to close a round with")
        outcome = admit_merge(contributions, lambda cs: self._outer_step(p, cs), self.limits)
        kept = {c.learner for c in outcome.kept}
        fresh_kept, late_kept = rnd.tokens(kept)
        fresh_all, late_all = rnd.tokens()
        self.ledger.merged += fresh_kept
        self.ledger.late_merged += late_kept
        self.ledger.rejected += fresh_all + late_all - fresh_kept - late_kept
        self.ledger.pending -= fresh_all + late_all
        self.rounds[p] = Round()
        self.clock = vclock.tick(self.clock, self.process)
        effects: list[Effect] = []
        for c, why in outcome.culprits:
            effects.append(self._record(now, "reject", learner=c.learner, fragment=p, c_tokens=c.c_tokens, reason=why))
            effects += self.reject(now, c.learner, f"fragment {p}: {why}")
        if outcome.result is not None:
            self.fragments[p], self.buffers[p] = outcome.result
            self.versions[p] += 1
            self.rounds_closed += 1
        admitted = [
            {
                "learner": c.learner,
                "late": c.learner in rnd.late and c.learner not in rnd.fresh,
                "c_steps": c.c_steps,
                "c_tokens": c.c_tokens,
                "weight": c.weight,
            }
            for c in sorted(outcome.kept, key=lambda c: c.learner)
        ]
        extra = {"rejected": sorted(c.learner for c, _ in outcome.culprits)} if outcome.culprits else {}
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
            **extra,
        )
        effects.insert(0, record)
        if outcome.result is not None:
            effects.append(Send(to=tuple(sorted(self.live)), message=self.fragment_message(p), reason="round"))
        return effects

    def discard_round(self, now: float, p: int, reason: str) -> list[Effect]:
        """Set aside a round that could not be merged; its tokens count as rejected, the fragment keeps its version."""
        rnd = self.rounds[p]
        fresh, late = rnd.tokens()
        self.ledger.rejected += fresh + late
        self.ledger.pending -= fresh + late
        self.rounds[p] = Round()
        self.degraded[p] = reason
        self.faults[p] += 1
        self.clock = vclock.tick(self.clock, self.process)
        return [self._record(now, "fault", fragment=p, reason=reason, discarded=sorted({*rnd.fresh, *rnd.late}))]

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

    def check_sender(self, learner: str) -> None:
        """Raise Suspended while ``learner`` is quarantined (every request of a suspended learner is refused)."""
        reason = self.quarantine.suspension(learner)
        if reason is not None:
            raise Suspended(
                f"learner {learner!r} is suspended ({reason}); an operator may readmit it: ddctl syncer readmit {learner}"
            )

    def _reject(self, now: float, update: Update, rejection: Rejection) -> tuple[Ack, list[Effect]]:
        p = update.fragment
        version = self.versions[p] if 0 <= p < self.fragmentation.count else -1
        ack = Ack(status="rejected", reason=rejection.reason, version=version, code=rejection.code)
        return ack, [self._update_record(now, update, ack), *self.reject(now, update.learner, rejection.reason)]

    def _poll_fragment(self, now: float, p: int) -> list[Effect]:
        rnd = self.rounds[p]
        if not self.live and (rnd.fresh or rnd.late):  # nobody left to wait for: merge what arrived
            return self.close_round(now, p, "final_drain", "no live learners remain; merging what arrived")
        if rnd.opened_at is None:
            return []
        view = RoundView(
            opened_at=rnd.opened_at, arrived=frozenset(rnd.fresh), live=frozenset(self.live), quorum_met_at=rnd.quorum_met_at
        )
        effects: list[Effect] = []
        try:
            decision = decide_round(now, view, self._timing(now, p), self.config.quorum)
        except Exception as exc:  # noqa: BLE001 - a bad estimate must not stop the round: decide without grace
            reason = f"grace estimate of fragment {p} failed ({type(exc).__name__}: {exc}); deciding without grace"
            effects.append(Fault(fragment=p, reason=reason, error=exc))
            self.degraded[p] = reason
            self.faults[p] += 1
            decision = decide_round(now, view, Timing(step_time=0.0), self.config.quorum)
        return effects + self._apply_decision(now, p, decision, clean=not effects)

    def _apply_decision(self, now: float, p: int, decision: RoundDecision, clean: bool) -> list[Effect]:
        rnd = self.rounds[p]
        if rnd.quorum_met_at is None and (decision.close or decision.wake_at is not None):
            rnd.quorum_met_at = now
        rnd.wake_at = decision.wake_at
        if not decision.close:
            return []
        if clean:
            self.degraded.pop(p, None)
        return self.close_round(now, p, decision.cause, decision.reason, decision.grace_s)

    def _outer_step(
        self, p: int, contributions: Sequence[Contribution]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        fused = fused_outer_step(
            self.fragments[p],
            self.buffers[p],
            contributions,
            embeddings=self.embeddings,
            method=self.config.merge,
            config=self.config.outer,
            taken=self.versions[p],
        )
        if fused is not None:
            return fused
        delta = merge_fragment(contributions, self.embeddings, self.config.merge)
        return outer_step(self.fragments[p], delta, self.buffers[p], self.config.outer, self.versions[p])

    def _timing(self, now: float, p: int) -> Timing:
        periods = {m: self.config.inner_steps * self.cadence.get(m, 1) for m in self.live}
        return round_timing(now, p, self.rounds[p], self.live, self._links, self.fragmentation.count, periods)

    def _record(self, now: float, kind: str, **fields: Any) -> Record:
        t = round(now, 9) if math.isfinite(now) else now
        return Record(entry={"type": kind, "t": t, "vclock": dict(self.clock), **fields})

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
            **({"absorbed": [list(a) for a in update.absorbed]} if update.absorbed else {}),
        )

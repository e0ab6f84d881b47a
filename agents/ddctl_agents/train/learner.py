"""One Decoupled DiLoCo learner, without I/O (ALGORITHM.md §3).

A learner is an ordinary training loop (inner AdamW, never reset) plus, per
fragment p, a reference point ref_p and counters c_steps[p], c_tokens[p]. After
every inner step the shell asks which fragments are due, sends their outer
gradients ``ref_p - theta_p`` and hands over fragment versions that arrived;
adopting one overwrites theta_p (no alpha-mixing).

[ours] ref_p is the adopted global value, or theta_p at the last send if that
is later: a second send before the answer arrives carries only the new drift,
so no drift is ever applied twice. In the normal flow this is exactly
``Theta_p(base) - theta_p``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from ddctl_agents.core import codec as codecs
from ddctl_agents.core import schedule, vclock
from ddctl_agents.core.fragments import Fragmentation
from ddctl_agents.core.messages import Adoption, FragmentVersion, Update
from ddctl_agents.train.config import InnerConfig, SyncSettings
from ddctl_agents.train.hostcopy import Snapshot
from ddctl_agents.train.inner import InnerTrainer
from ddctl_agents.train.optim import inner_lr


@dataclass(slots=True)
class LearnerLedger:
    """Learner-side token accounting in fragment-tokens (see core.ledger)."""

    trained: int = 0
    sent: int = 0
    overwritten: int = 0
    """Drift discarded because a new version of its fragment arrived before it was sent."""


@dataclass(slots=True)
class _FragmentState:
    version: int = -1
    ref: dict[str, torch.Tensor] = field(default_factory=dict)
    residual: dict[str, torch.Tensor] = field(default_factory=dict)
    c_steps: int = 0
    c_tokens: int = 0
    sent_since_adopt: bool = False
    due: int = 0
    """Inner step after which this fragment is next sent (core/schedule.py)."""


@dataclass(frozen=True, slots=True)
class PendingSend:
    """An outer gradient whose counters are settled and whose parameter snapshot may still be in flight."""

    fragment: int
    snapshot: Snapshot | None
    """The leader's host copy of the fragment's parameters; None on the other ranks."""
    base_version: int
    update_id: str
    step: int
    c_steps: int
    c_tokens: int
    vclock: dict[str, int]
    adoptions: tuple[Adoption, ...]


class Learner:
    """Inner trainer and per-fragment sync state of one learner (on every one of its ranks)."""

    def __init__(
        self,
        *,
        name: str,
        trainer: InnerTrainer,
        inner: InnerConfig,
        sync: SyncSettings,
        fragmentation: Fragmentation,
        total_steps: int,
        start_step: int = 0,
        incarnation: int = 0,
        cadence: int = 1,
    ) -> None:
        """``cadence``: send each fragment every ``cadence`` periods of H steps (a learner on a slow link)."""
        self.name, self.incarnation = name, incarnation
        self.trainer, self.inner, self.sync = trainer, inner, sync
        self.fragmentation, self.total_steps = fragmentation, total_steps
        self.cadence = schedule.check_cadence(cadence)
        self.period = sync.inner_steps * cadence
        """Inner steps between two sends of a fragment: H at cadence 1."""
        self.step = start_step
        self.state = [
            _FragmentState(due=schedule.next_due_step(start_step, p, sync.fragments, self.period))
            for p in range(fragmentation.count)
        ]
        self.ledger = LearnerLedger()
        self.clock: dict[str, int] = {}
        self.adoptions: list[Adoption] = []
        self._ids = itertools.count()
        self.tokens_per_step = trainer.sampler.batch_size * trainer.sampler.seq_len
        """The learner's tokens per step, all ranks together (each rank trains its share of the batch)."""

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return self.trainer.params

    @property
    def ready(self) -> bool:
        """True once every fragment has been adopted at least once (bootstrapped)."""
        return all(s.version >= 0 for s in self.state)

    def train_step(self) -> torch.Tensor:
        """One inner step on the next batch; returns the detached loss (no host sync)."""
        loss = self.trainer.step(self.step, inner_lr(self.step, self.total_steps, self.inner))
        self.step += 1
        for s in self.state:
            s.c_steps += 1
            s.c_tokens += self.tokens_per_step
        self.ledger.trained += self.tokens_per_step * len(self.state)
        return loss

    def due(self) -> list[int]:
        """Fragments to send after the step just taken."""
        return [p for p, s in enumerate(self.state) if s.due <= self.step]

    def due_steps(self) -> tuple[int, ...]:
        """Each fragment's next send, for heartbeats: the syncer forecasts arrivals from them.

        None is due past the last step, where the learner flushes every fragment's drift: a
        syncer that expected those sends on the normal schedule closed their rounds without them."""
        return tuple(min(s.due, self.total_steps) for s in self.state)

    def has_drift(self, p: int) -> bool:
        return self.state[p].c_steps > 0

    def make_update(self, p: int) -> Update:
        """The outer gradient of fragment p since its reference point; moves the reference (synchronous)."""
        update = self.finish_send(self.begin_send(p))
        if update is None:
            raise RuntimeError("only the leader rank makes updates")
        return update

    @torch.no_grad()
    def begin_send(self, p: int) -> PendingSend:
        """Settle fragment p's counters and start copying its parameters to the host (every rank calls it)."""
        s = self.state[p]
        if s.version < 0 or s.c_steps == 0:
            raise RuntimeError(f"fragment {p} has no drift to send (version {s.version}, {s.c_steps} steps)")
        snapshot = self.trainer.read([spec.name for spec in self.fragmentation.fragments[p]])
        self.clock = vclock.tick(self.clock, self.name)
        pending = PendingSend(
            fragment=p,
            snapshot=snapshot,
            base_version=s.version,
            update_id=f"{self.name}.{self.incarnation}.{next(self._ids)}",
            step=self.step,
            c_steps=s.c_steps,
            c_tokens=s.c_tokens,
            vclock=dict(self.clock),
            adoptions=tuple(self.adoptions),
        )
        self.ledger.sent += s.c_tokens
        self.adoptions.clear()
        s.c_steps = s.c_tokens = 0
        s.sent_since_adopt = True
        s.due = self.step + self.period
        return pending

    def finish_send(self, pending: PendingSend) -> Update | None:
        """The update once its snapshot is on the host: drift from the anchor, which moves to the snapshot.

        Call it before adopting a newer version of the same fragment (the loop finishes
        every pending send before it adopts). None on ranks other than the leader.
        """
        if pending.snapshot is None:
            return None
        s = self.state[pending.fragment]
        tensors: dict[str, torch.Tensor] = {}
        for name, theta in pending.snapshot.wait().items():
            delta = s.ref[name] - theta
            if self.sync.error_feedback:
                delta += s.residual.get(name, 0.0)
                s.residual[name] = delta - codecs.roundtrip(self.sync.codec, delta, self.sync.block)
            tensors[name] = delta
            s.ref[name] = theta
        return Update(
            learner=self.name,
            incarnation=self.incarnation,
            fragment=pending.fragment,
            base_version=pending.base_version,
            update_id=pending.update_id,
            step=pending.step,
            c_steps=pending.c_steps,
            c_tokens=pending.c_tokens,
            tensors=tensors,
            vclock=pending.vclock,
            adoptions=pending.adoptions,
        )

    def on_arrival(self, message: FragmentVersion) -> Update | None:
        """Adopt a newer version; returns the drift to push first, if the settings say so."""
        s = self.state[message.fragment]
        if message.version <= s.version:
            return None
        update = None
        if self.sync.push_before_overwrite and s.version >= 0 and s.c_steps > 0 and not s.sent_since_adopt:
            update = self.finish_send(self.begin_send(message.fragment))  # None on ranks other than the leader
        self.adopt(message)
        return update

    def adopt(self, message: FragmentVersion) -> bool:
        """Overwrite fragment values with a newer global version; False if it is not newer.

        On the leader ``message`` carries the values, which become the fragment's anchor
        in (pinned) host memory; the other ranks receive them from the leader, so their
        message needs only the fragment and version.
        """
        s = self.state[message.fragment]
        if message.version <= s.version:
            return False
        names = [spec.name for spec in self.fragmentation.fragments[message.fragment]]
        if self.trainer.leader:
            for name in names:
                s.ref[name] = self.trainer.copier.anchor(message.tensors[name].reshape(self.params[name].shape))
        self.trainer.write({name: s.ref.get(name) for name in names})
        self.ledger.overwritten += s.c_tokens
        if s.version >= 0:  # a bootstrap keeps the staggered first sends
            s.due = schedule.due_after_adoption(self.step, self.period)
        s.version, s.c_steps, s.c_tokens, s.sent_since_adopt = message.version, 0, 0, False
        self.clock = vclock.receive(self.clock, vclock.own(message.vclock), self.name)  # no peer's made-up keys
        self.adoptions.append((message.fragment, message.version, self.step))
        return True

    def skip_update_id(self) -> None:
        """Pass over one update id: a replay's learner whose update of that id never arrived anywhere (lost in
        flight with its process), so that the ids of the ones that did line up."""
        next(self._ids)

    def unsent(self) -> int:
        """Fragment-tokens trained but not yet sent."""
        return sum(s.c_tokens for s in self.state)

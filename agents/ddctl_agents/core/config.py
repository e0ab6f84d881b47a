"""What shapes the synchronizer's decisions, as typed configs validated on creation (torch-free).

The outer optimiser, the trust bounds and the syncer's own knobs live here so
that every process of a job, and ``ddctl --help``, can build a JobConfig without
importing torch. The quorum's knobs sit beside their decision in ``quorum.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddctl_agents.core.choices import LATE_WEIGHTS, MERGES
from ddctl_agents.core.quorum import QuorumConfig
from ddctl_agents.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class OuterConfig:
    """Outer Nesterov SGD hyper-parameters."""

    lr: float = 0.7
    momentum: float = 0.5
    nesterov: bool = True
    warmup: int = 0
    """[ours] Outer steps over which each fragment's learning rate ramps up linearly (0: none): step v of a
    fragment (0-based) uses lr * min(1, (v + 1) / warmup). A literature lever (outer-lr warm-up), measured in
    docs/benchmarks.md; off by default."""

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"outer lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"outer momentum must be in [0, 1), got {self.momentum}")
        if not 0 <= self.warmup <= 1_000_000:
            raise ConfigError(f"outer warmup must be an integer in 0..1000000 (outer steps), got {self.warmup}")

    def lr_at(self, step: int) -> float:
        """The learning rate of a fragment's outer step ``step`` (0-based), after the warm-up's ramp."""
        return self.lr if self.warmup <= 0 else self.lr * min(1.0, (step + 1) / self.warmup)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustConfig:
    """How far the syncer trusts a learner's numbers [ours]; every bound is derived from the job."""

    max_rejections: int = 3
    """Rejected updates after which a learner is suspended until an operator readmits it (0: never)."""
    drift_safety: float = 4.0
    """Margin on the largest drift the inner optimiser can make in the steps an update claims."""
    result_bound: float = 1000.0
    """A published parameter may not exceed this times max(1, the largest initial |parameter|)."""

    def __post_init__(self) -> None:
        if self.max_rejections < 0:
            raise ConfigError(f"trust.max_rejections must be >= 0, got {self.max_rejections}")
        if not 1.0 <= self.drift_safety <= 1e6:
            raise ConfigError(f"trust.drift_safety must be in [1, 1e6], got {self.drift_safety}")
        if not 1.0 <= self.result_bound <= 1e30:
            raise ConfigError(f"trust.result_bound must be in [1, 1e30], got {self.result_bound}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncerConfig:
    """Everything that shapes the syncer's decisions."""

    quorum: QuorumConfig = field(default_factory=QuorumConfig)
    outer: OuterConfig = field(default_factory=OuterConfig)
    merge: str = "rda"
    inner_steps: int = 24
    """H, needed to forecast when an absent learner's update is due; overlap (tau) may not exceed it."""
    max_behind: int = 0
    """[ours] Late updates at most this many periods behind (beyond a cadence's own) fold into the next round; 0 drops
    them with a resync. Folded, an update from a base that has moved on steps the learners' shared direction twice:
    the example job read 3.33 at 1 against 3.21 at 0, over the emulated WAN 4.09 against 3.70 (docs/benchmarks.md)."""
    late_weight: str = "staleness"
    """[ours] How an update behind its fragment's version is weighed (``choices.LATE_WEIGHTS``): "staleness" divides
    its period's weight by one plus the versions it is behind, so a cadence's late drift counts for less the older it
    is; "period" weighs it as one period of its tokens. Staleness cut the cost of a learner at cadence 4 from 0.053 to
    0.021 val_bpb and at 8 from 0.094 to 0.036 in the virtual cluster (three seeds each, lower on every one); over the
    emulated WAN it was lower in five runs of six, W's gap to one synchronizer 0.050 against 0.103 (docs/benchmarks.md)."""
    trust: TrustConfig = field(default_factory=TrustConfig)
    """What a learner's update may claim before it is refused, and when its sender is suspended."""

    def __post_init__(self) -> None:
        if self.merge not in MERGES:
            raise ConfigError(f"merge must be one of {', '.join(MERGES)}, got {self.merge!r}")
        if self.late_weight not in LATE_WEIGHTS:
            raise ConfigError(f"late_weight must be one of {', '.join(LATE_WEIGHTS)}, got {self.late_weight!r}")
        if self.max_behind < 0:
            raise ConfigError(f"max_behind must be >= 0, got {self.max_behind}")
        if self.quorum.overlap > self.inner_steps:  # ALGORITHM.md §3: an answer lands before its fragment is due again
            raise ConfigError(
                f"overlap (tau) must be in 0..{self.inner_steps} (at most inner_steps, H), got {self.quorum.overlap}: "
                "a fragment is sent every H steps, so its answer must land within H steps"
            )

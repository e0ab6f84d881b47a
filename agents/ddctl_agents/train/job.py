"""What every process of one job must agree on: model, data, budget, sync and syncer settings.

The syncer service reads it from the job file and hands it to learners at
registration (``GET /v1/job``), so a learner needs only the syncer's address
and its token. The virtual cluster's ``TrainConfig`` extends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddctl_agents.core.choices import CODECS, DOWN_CODECS, STRATEGIES
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget, SyncSettings, require
from ddctl_agents.train.presets import get_preset

MOST_THREADS = 1024
"""More torch threads than any machine has cores: a job asking a million ended every learner in libgomp."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobConfig:
    """One Decoupled DiLoCo job, fully specified."""

    inner: InnerConfig = field(default_factory=InnerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    budget: RunBudget = field(default_factory=RunBudget)
    sync: SyncSettings = field(default_factory=SyncSettings)
    syncer: SyncerConfig = field(default_factory=SyncerConfig)
    fragmentation: str = "balanced"
    down_codec: str = "bf16"
    """Codec of fragments sent back to learners (outer gradients use sync.codec)."""
    threads: int = 1
    """torch intra-op threads; fixed so that runs and replays are bit-identical."""

    def __post_init__(self) -> None:
        require(
            self.fragmentation in STRATEGIES, f"fragmentation must be one of {', '.join(STRATEGIES)}, got {self.fragmentation!r}"
        )
        require(
            self.down_codec in DOWN_CODECS,
            f"down codec must be one of {', '.join(DOWN_CODECS)}, got {self.down_codec!r}",
        )
        require(self.sync.inner_steps == self.syncer.inner_steps, "sync.inner_steps and syncer.inner_steps must agree")
        require(1 <= self.threads <= MOST_THREADS, f"threads must be in [1, {MOST_THREADS}], got {self.threads}")
        require(
            self.syncer.quorum.quorum <= self.budget.learners,
            f"quorum ({self.syncer.quorum.quorum}) must be at most the learners ({self.budget.learners}): K of M learners' "
            "updates close a round",
        )
        require(self.sync.codec in CODECS, f"codec must be one of {', '.join(CODECS)}")
        get_preset(self.inner.preset)  # an unknown preset fails here, naming the allowed ones

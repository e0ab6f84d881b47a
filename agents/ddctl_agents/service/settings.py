"""How one synchronizer service runs: its state directory, timeouts, and what it checkpoints (flags of ``ddctl syncer serve``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ddctl_agents.core.shardmap import ShardRole
from ddctl_agents.service.checkpoints import CheckpointPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSettings:
    state_dir: Path
    run: str = "run"
    max_update_bytes: int = 0
    """413 above this; 0 means twice the fp32 size of the largest fragment plus 1 MiB."""
    heartbeat_timeout_s: float = 20.0
    """A learner silent this long is declared gone and stops counting toward quorum."""
    snapshot_every_s: float = 30.0
    eval_every_s: float = 0.0
    """Evaluate the global model's val_bpb this often (0: never)."""
    keepalive_s: float = 5.0
    finish_timeout_s: float = 120.0
    """A finishing job waits this long for live learners to push their last drift and leave."""
    linger_s: float = 30.0
    """A finished syncer keeps answering status this long (the controller reads the summary), then exits."""
    checkpoints: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    resume_from: Path | None = None
    """A checkpoint directory a fresh state directory starts from (a new run resuming an old one's model)."""
    shard: ShardRole | None = None
    """This process's shard of a sharded synchronizer (None: it owns every fragment)."""
    site: str = ""
    """The region this process runs in: its own learners' transfers never cross its site's link ("": none are)."""

"""What a service's tape says beyond its core's records: where the run started, and how it ended.

``ddctl replay`` re-runs the learners of a tape through a fresh core (``ddctl/local/replay.py``). For that it
needs what the core's records do not hold: the job, the corpus it trained on, which shard wrote the tape and
the shard map it started from, whether it resumed from a checkpoint or imported a model of its own (the header),
and the result to compare with: a hash of the parameters this process owns at the end (the end record).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddctl_agents.core.tape import TAPE_FORMAT
from ddctl_agents.jsonable import to_json

if TYPE_CHECKING:
    import torch

    from ddctl_agents.service.runtime import SyncerRuntime


def header(rt: SyncerRuntime) -> dict[str, Any]:
    """The tape's first record: the job, its corpus, this shard (and the map it starts from), where it began."""
    role, settings, assembly = rt.role, rt.settings, rt.assembly
    return {
        "type": "config",
        "format": TAPE_FORMAT,
        "service": True,
        "config": to_json(assembly.config),
        "corpus_sha256": assembly.corpus.sha256,
        **({"shard": role.name, "shard_map": role.map.to_json()} if role is not None else {}),
        **({"resumed_from": str(settings.resume_from)} if settings.resume_from is not None else {}),
        **({"model_dir": str(assembly.model_dir)} if assembly.model_dir is not None else {}),
    }


def end_record(rt: SyncerRuntime, val_bpb: float | None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """On the core thread, once the last rounds closed: the end record but its hash, and the parameters this process
    owns (every fragment, or a shard's own) to hash off the core thread: what its replay must reproduce."""
    syncer, role = rt.syncer, rt.role
    owned = sorted(role.owned) if role is not None else list(range(syncer.fragmentation.count))
    params = {name: t for p in owned for name, t in syncer.fragments[p].items()}
    record = {"type": "end", "t": round(rt.clock(), 9), "fragments": owned, "val_bpb": val_bpb, "rounds": syncer.rounds_closed}
    return record, params

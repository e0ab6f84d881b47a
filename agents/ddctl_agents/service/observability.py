"""What the syncer shows about itself: ``status`` as JSON and ``health`` for probes (metrics: ``metrics.py``).

Both are read-only views of the runtime, computed on the core thread so they
see one consistent moment. Neither can carry a non-finite number: inputs are
bounded where they enter, and ``finite`` replaces anything that still is not
finite with null (a status page that answers 500 helps nobody).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ddctl_agents.core.ending import FINISHED, STOPPED
from ddctl_agents.core.links import LearnerLinks, LinkEstimate
from ddctl_agents.service.ending import tokens
from ddctl_agents.service.roster import counted
from ddctl_agents.train.flops import utilisation

if TYPE_CHECKING:
    from ddctl_agents.service.roster import LearnerInfo
    from ddctl_agents.service.runtime import SyncerRuntime


def _mbps(link: LinkEstimate) -> float | None:
    return None if link.bytes_per_s is None else round(link.bytes_per_s * 8 / 1e6, 3)


def _ms(link: LinkEstimate) -> float | None:
    return None if link.rtt_s is None else round(link.rtt_s * 1000, 3)


def _link_view(links: LearnerLinks) -> dict[str, Any]:
    return {
        "up_mbps": _mbps(links.up),
        "down_mbps": _mbps(links.down),
        "rtt_ms": _ms(links.up),
        "up_sampled_bytes": links.up.total_bytes,  # what the rate was read from, not all that crossed the link
        "down_sampled_bytes": links.down.total_bytes,
        "up_timed_by": _timed_by(links.up),
        "down_timed_by": _timed_by(links.down),
    }


def _site_view(up: LinkEstimate, down: LinkEstimate) -> dict[str, Any]:
    """The site's link as every transfer across it measured it: ``up`` what left it, ``down`` what arrived."""
    sampled = {"up_sampled_bytes": up.total_bytes, "down_sampled_bytes": down.total_bytes}
    return {"up_mbps": _mbps(up), "down_mbps": _mbps(down), **sampled}


def _timed_by(link: LinkEstimate) -> str | None:
    """Who timed the rate shown: the sender's "kernel" (TCP_INFO), the syncer's "app" reads (a fallback), or nobody."""
    return None if link.bytes_per_s is None else "kernel" if link.kernel else "app"


def learner_mfu(rt: SyncerRuntime, info: LearnerInfo) -> float | None:
    """The learner's model FLOPs utilisation by this job's model (not its own claim), or None without a known peak."""
    value = utilisation(info.tokens_per_s * rt.flops_per_token, info.accelerator, info.devices)
    return None if value is None else round(value, 4)


def status(rt: SyncerRuntime) -> dict[str, Any]:
    s, now = rt.syncer, rt.clock()
    learners = []
    for name in sorted(rt.roster.info):
        info = rt.roster.info[name]
        links = s.links.get(name, LearnerLinks())
        learners.append(
            {
                "id": name,
                "region": info.region,
                "incarnation": info.incarnation,
                "state": _state(rt, name, info.state),
                "live": name in s.live,
                "step": info.step,
                "tokens": info.tokens,
                "tokens_per_s": round(info.tokens_per_s, 1),
                "accelerator": info.accelerator,
                "devices": info.devices,
                "memory_gb": info.memory_gb,
                "mfu": learner_mfu(rt, info),
                "loss": info.loss,
                "staleness": info.staleness,
                "cadence": s.cadence.get(name, 1),
                "uploads_in_flight": info.uploads_in_flight or None,
                "step_time_s": links.pace.step_time,
                "train_s": counted(info),
                "seen_s_ago": round(now - info.last_seen, 3),
                "updates": dict(info.updates),
                "rejections": standing.rejections if (standing := s.quarantine.standings.get(name)) else 0,
                "suspended": s.quarantine.suspension(name),
                **_link_view(links),
            }
        )
    for meters in (rt.roster.site_links, *rt.roster.together.values()):
        meters.read(now)
    together = {
        name: {"together_up_mbps": _mbps(m.up.estimate), "together_down_mbps": _mbps(m.down.estimate)}
        for name, m in rt.roster.together.items()
    }
    regions = [
        {"name": name, "learners": sum(1 for i in rt.roster.info.values() if i.region == name), **_link_view(links),
         **together.get(name, {})}
        for name, links in sorted(rt.roster.regions.items())
    ]  # fmt: skip
    site = rt.roster.site_links
    ledger = s.ledger
    view: dict[str, Any] = finite(
        {
            "run": rt.settings.run,
            "time": round(now, 3),
            "uptime_s": round(now - rt.started_at, 3),
            "job": rt.ending.view(),
            "tokens": tokens(rt),
            "quorum_s": round(rt.quorum_clock.seconds(now), 3),
            "parameters": rt.parameters,
            "rounds": s.rounds_closed,
            "versions": list(s.versions),
            "fragments": s.fragmentation.count,
            "quorum": s.config.quorum.quorum,
            "grace": s.config.quorum.grace,
            "live": sorted(s.live),
            "finished": sorted(s.finished),
            "learners": learners,
            "regions": regions,
            "site": {"name": rt.roster.site, **_site_view(site.up.estimate, site.down.estimate)},
            "relays": rt.streams.view(now, rt.roster.info, s.live),
            "ledger": {**ledger.as_dict(), "balanced": ledger.balanced()},
            "degraded": [{"fragment": p, "reason": reason} for p, reason in sorted(rt.degraded().items())],
            "faults": list(s.faults),
            "suspended": s.quarantine.suspended(),
            "task_failures": dict(rt.task_failures),
            "recent_rounds": list(rt.roster.recent_rounds),
            "events": list(rt.roster.events),
            "val_bpb": [list(v) for v in rt.val_bpb],
            "bytes_up": rt.bytes_up,
            "bytes_down": rt.bytes_down,
            "rejections": {str(k): v for k, v in sorted(rt.rejections.items())},
            "snapshots": dict(rt.snapshots),
            "recovered": dict(rt.recovered),
            "clock": dict(s.clock),
            "shard": _shard_view(rt),
        }
    )
    return view


def _shard_view(rt: SyncerRuntime) -> dict[str, Any] | None:
    """Which shard this is, what it owns and the map it serves (None: one synchronizer owning every fragment): whoever
    reads every shard can tell a fragment whose owner did not answer from one in the middle of a handoff."""
    role = rt.role
    if role is None:
        return None
    return {"name": role.name, "epoch": role.map.epoch, "shards": list(role.map.shards), "owned": sorted(role.owned),
            "owners": list(role.map.owners)}  # fmt: skip


def health(rt: SyncerRuntime) -> dict[str, Any]:
    """The probe's answer: serving, and what is degraded (a fragment, a suspended learner, a restarted task)."""
    degraded = [{"fragment": p, "reason": reason} for p, reason in sorted(rt.degraded().items())]
    return {
        "ok": True,
        "run": rt.settings.run,
        "state": "degraded" if degraded else "healthy",
        "job": rt.ending.phase,
        "degraded": degraded,
        "suspended": rt.syncer.quarantine.suspended(),
        "task_failures": dict(rt.task_failures),
    }


def _state(rt: SyncerRuntime, name: str, state: str) -> str:
    if rt.syncer.quarantine.suspension(name) is not None:
        return "suspended"
    if name in rt.syncer.live:
        return state
    return state if state in ("left", FINISHED, STOPPED) else "gone"


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, so it always serialises as JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def vector_clock(rt: SyncerRuntime) -> dict[str, Any]:
    s = rt.syncer
    return {"clock": dict(s.clock), "versions": list(s.versions), "rounds": s.rounds_closed}

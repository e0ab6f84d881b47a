"""What the syncer shows about itself: ``status`` as JSON, ``metrics`` as Prometheus text.

Both are read-only views of the runtime, computed on the core thread so they
see one consistent moment. Neither can carry a non-finite number: inputs are
bounded where they enter, and ``finite`` replaces anything that still is not
finite with null (a status page that answers 500 helps nobody).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ddctl_agents.core.links import LearnerLinks, LinkEstimate

if TYPE_CHECKING:
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
        "up_bytes": links.up.total_bytes,
        "down_bytes": links.down.total_bytes,
    }


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
                "loss": info.loss,
                "staleness": info.staleness,
                "step_time_s": links.pace.step_time,
                "seen_s_ago": round(now - info.last_seen, 3),
                "updates": dict(info.updates),
                "rejections": standing.rejections if (standing := s.quarantine.standings.get(name)) else 0,
                "suspended": s.quarantine.suspension(name),
                **_link_view(links),
            }
        )
    regions = [
        {"name": name, "learners": sum(1 for i in rt.roster.info.values() if i.region == name), **_link_view(links)}
        for name, links in sorted(rt.roster.regions.items())
    ]
    ledger = s.ledger
    view: dict[str, Any] = finite(
        {
            "run": rt.settings.run,
            "time": round(now, 3),
            "uptime_s": round(now - rt.started_at, 3),
            "quorum_s": round(rt.quorum_clock.seconds(now), 3),
            "parameters": rt.parameters,
            "rounds": s.rounds_closed,
            "versions": list(s.versions),
            "fragments": s.fragmentation.count,
            "quorum": s.config.quorum.quorum,
            "grace": s.config.quorum.grace,
            "live": sorted(s.live),
            "learners": learners,
            "regions": regions,
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
        }
    )
    return view


def health(rt: SyncerRuntime) -> dict[str, Any]:
    """The probe's answer: serving, and what is degraded (a fragment, a suspended learner, a restarted task)."""
    degraded = [{"fragment": p, "reason": reason} for p, reason in sorted(rt.degraded().items())]
    return {
        "ok": True,
        "run": rt.settings.run,
        "state": "degraded" if degraded else "healthy",
        "degraded": degraded,
        "suspended": rt.syncer.quarantine.suspended(),
        "task_failures": dict(rt.task_failures),
    }


def _state(rt: SyncerRuntime, name: str, state: str) -> str:
    if rt.syncer.quarantine.suspension(name) is not None:
        return "suspended"
    if name in rt.syncer.live:
        return state
    return "left" if state == "left" else "gone"


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


def metrics(rt: SyncerRuntime) -> str:
    """Prometheus text exposition format, version 0.0.4."""
    s = rt.syncer
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float | int | None]]) -> None:
        out.append(f"# HELP ddctl_{name} {help_text}")
        out.append(f"# TYPE ddctl_{name} {kind}")
        for labels, value in samples:
            if value is None or not math.isfinite(value):
                continue
            label = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            out.append(f"ddctl_{name}{{{label}}} {value}" if label else f"ddctl_{name} {value}")

    family("rounds_total", "counter", "Rounds merged since the job started.", [({}, s.rounds_closed)])
    family(
        "fragment_version",
        "gauge",
        "Current version of each fragment.",
        [({"fragment": str(p)}, v) for p, v in enumerate(s.versions)],
    )
    family("learners_live", "gauge", "Learners currently counted toward quorum.", [({}, len(s.live))])
    ledger = s.ledger
    family(
        "ledger_fragment_tokens",
        "gauge",
        "Token ledger in fragment-tokens, by bucket.",
        [({"bucket": k}, v) for k, v in ledger.as_dict().items()],
    )
    degraded = rt.degraded()
    family(
        "fragment_faults_total",
        "counter",
        "Unexpected errors in a fragment's rounds.",
        [({"fragment": str(p)}, n) for p, n in enumerate(s.faults)],
    )
    family(
        "fragment_degraded",
        "gauge",
        "1 while a fragment's last round failed or its version could not be sent.",
        [({"fragment": str(p)}, int(p in degraded)) for p in range(s.fragmentation.count)],
    )
    standings = sorted(s.quarantine.standings.items())
    family(
        "learner_rejections_total",
        "counter",
        "Updates refused for their content, per learner, since it was last admitted.",
        [({"learner": m}, st.rejections) for m, st in standings],
    )
    family(
        "learner_suspended",
        "gauge",
        "1 while a learner is suspended until an operator readmits it.",
        [({"learner": m}, int(st.suspended is not None)) for m, st in standings],
    )
    family(
        "task_failures_total",
        "counter",
        "Failures of the service's long-lived tasks (each was restarted).",
        [({"task": name}, n) for name, n in sorted(rt.task_failures.items())],
    )
    rates: list[tuple[dict[str, str], float | int | None]] = []
    rtts: list[tuple[dict[str, str], float | int | None]] = []
    for name, links in sorted(s.links.items()):
        region = rt.roster.region_of(name)
        for direction, link in (("up", links.up), ("down", links.down)):
            rates.append(({"learner": name, "region": region, "direction": direction}, link.bytes_per_s))
        rtts.append(({"learner": name, "region": region}, links.up.rtt_s))
    family("link_bytes_per_second", "gauge", "EWMA throughput measured from real transfers.", rates)
    family("link_rtt_seconds", "gauge", "EWMA round-trip time reported by learners.", rtts)
    regional = [
        ({"region": name, "direction": d}, link.bytes_per_s)
        for name, links in sorted(rt.roster.regions.items())
        for d, link in (("up", links.up), ("down", links.down))
    ]
    family("region_bytes_per_second", "gauge", "EWMA throughput per region.", regional)
    family("bytes_received_total", "counter", "Update bytes accepted.", [({}, rt.bytes_up)])
    family("bytes_sent_total", "counter", "Fragment bytes streamed to learners.", [({}, rt.bytes_down)])
    family(
        "http_rejections_total",
        "counter",
        "Requests refused, by status.",
        [({"code": str(k)}, v) for k, v in sorted(rt.rejections.items())],
    )
    family("snapshots_total", "counter", "Durable snapshots written.", [({}, rt.snapshots["taken"])])
    if rt.val_bpb:
        family("val_bpb", "gauge", "Validation bits per byte of the global model.", [({}, rt.val_bpb[-1][2])])
    return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

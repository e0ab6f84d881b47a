"""What the dashboard shows, as plain data: the syncer's status joined with ddctl's own records.

Pure: it takes the syncer's answer (or why there is none and how old the last
one is), the run's instance records and events, and the regions' prices, and
returns one JSON-able dict. ``ddctl status --json`` prints exactly this;
``ddctl status`` and ``--watch`` draw it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ddctl.control.shard_status import relay_reading, site_reading
from ddctl.control.state import GIVEN_UP, InstanceRecord
from ddctl_agents.service.ending import goodput as learner_goodput

DP_BYTES_PER_PARAM_STEP = 2 * 4
"""Data-parallel training all-reduces every fp32 gradient each step; a ring sends about twice its size per rank."""
EVENTS_KEPT = 50
ROUNDS_KEPT = 8


@dataclass(frozen=True, slots=True)
class RegionInfo:
    """What the regions file says about a region: its provider, zones and price per instance-hour."""

    provider: str
    zones: tuple[str, ...] = ()
    dollars_per_hour: float | None = 0.0


@dataclass(frozen=True, slots=True)
class SyncerView:
    """The last answer of the syncer, when it came, and the error of the latest attempt (if it failed)."""

    status: dict[str, Any] | None
    fetched_at: float | None
    error: str | None = None
    url: str = ""
    unusable: bool = False
    """The latest attempt reached the synchronizer, but its answer was of another shape: not a network problem."""


@dataclass(frozen=True, slots=True)
class RunRecords:
    run: str
    provider: str
    instances: list[InstanceRecord]
    events: list[dict[str, Any]] = field(default_factory=list)
    regions: dict[str, RegionInfo] = field(default_factory=dict)
    state: str = "training"
    """The run's state in ddctl's records (``training``, ``finished``, ``kept``, ``down``, ...)."""
    summary: dict[str, Any] | None = None
    """The finished job's result as the controller recorded it (checked), once there is one."""
    replanner: dict[str, Any] | None = None
    """A sharded run's re-planner's last look (``control/run_replanning.py``), once it has looked."""


OFF_THE_BILL = ("finished", "given up")
"""A learner in these states has no machine: the controller removed it (its work done, or it kept failing)."""


def learner_state(record: InstanceRecord, seen: dict[str, Any] | None) -> str:
    """provisioning, deploying, training, suspended, preempted, rejoining, finished, given up or gone."""
    if seen is not None and seen.get("state") == "suspended":
        return "suspended"
    if seen is not None and seen.get("live"):
        return "training"
    if seen is not None and seen.get("state") in ("finished", "stopped"):  # it left having done its share
        return "finished"
    if record.state in ("finished", "preempted", "rejoining"):
        return record.state
    if record.state == GIVEN_UP:  # the controller stopped starting it: it kept failing soon after each start
        return "given up"
    if record.state in ("starting", "deploying"):
        return "deploying" if record.provider_id else "provisioning"
    return "gone"


def build(records: RunRecords, syncer: SyncerView, now: float) -> dict[str, Any]:
    status = syncer.status or {}
    seen = {entry["id"]: entry for entry in status.get("learners", [])}
    preempted = _count(records.events, "preempted")
    replaced = _count(records.events, "replaced")
    regions: dict[str, dict[str, Any]] = {}
    vms = Counter(str(r.detail.get("learner")) for r in records.instances if r.role == "learner" and "learner" in r.detail)
    for record in records.instances:
        if record.role not in ("learner", "syncer"):
            continue
        info = records.regions.get(record.region, RegionInfo(record.provider))
        region = regions.setdefault(
            record.region,
            {
                "name": record.region,
                "provider": record.provider,
                "zones": list(info.zones),
                "dollars_per_hour": 0.0,
                "learners": [],
            },
        )
        entry = seen.get(record.name)
        state = learner_state(record, entry) if record.role == "learner" else ""
        each = info.dollars_per_hour if state not in OFF_THE_BILL else 0.0
        if each is None or region["dollars_per_hour"] is None:
            region["dollars_per_hour"] = None
        else:
            region["dollars_per_hour"] += each
        if record.role != "learner":
            region["syncer"] = True
            continue
        if int(record.detail.get("node", 0)) > 0:  # a learner's other VMs: one row, node 0's, priced for all of them
            continue
        region["learners"].append(
            {
                "id": record.name,
                "state": state,
                "zone": (record.detail.get("spec") or {}).get("zone") or (info.zones[0] if info.zones else None),
                "step": (entry or {}).get("step", 0),
                "tokens_per_s": (entry or {}).get("tokens_per_s", 0.0),
                "accelerator": (entry or {}).get("accelerator", ""),
                "devices": (entry or {}).get("devices"),
                "memory_gb": (entry or {}).get("memory_gb"),
                "mfu": (entry or {}).get("mfu"),
                "loss": (entry or {}).get("loss"),
                "staleness": (entry or {}).get("staleness"),
                "cadence": (entry or {}).get("cadence"),
                "uploads_in_flight": (entry or {}).get("uploads_in_flight"),
                "up_mbps": (entry or {}).get("up_mbps"),
                "down_mbps": (entry or {}).get("down_mbps"),
                "rtt_ms": (entry or {}).get("rtt_ms"),
                "seen_s_ago": (entry or {}).get("seen_s_ago"),
                "rejections": (entry or {}).get("rejections", 0),
                "incarnation": (entry or {}).get("incarnation"),
                "preemptions": preempted.get(record.name, 0),
                "replacements": replaced.get(record.name, 0),
                "vms": vms.get(record.name, 1),
                "dollars_per_hour": None if each is None else each * vms.get(record.name, 1),
            }
        )
    prices = [r["dollars_per_hour"] for r in regions.values()]
    return {
        "run": records.run,
        "provider": records.provider,
        "syncer": {
            "reachable": syncer.error is None and syncer.status is not None,
            "error": syncer.error,
            "unusable": syncer.error is not None and syncer.unusable,
            "url": syncer.url,
            "age_s": None if syncer.fetched_at is None else round(max(now - syncer.fetched_at, 0.0), 1),
        },
        "rounds": status.get("rounds", 0),
        "rounds_per_min": rounds_per_min(status.get("recent_rounds", [])),
        "fragments": status.get("fragments"),
        "versions": status.get("versions", []),
        "quorum": status.get("quorum"),
        "grace": status.get("grace"),
        "recent_rounds": status.get("recent_rounds", [])[-ROUNDS_KEPT:],
        "val_bpb": [[round(t, 1), v] for t, *_, v in status.get("val_bpb", [])],
        "goodput": goodput(status),
        "uptime": _ratio(status.get("quorum_s"), status.get("uptime_s")),
        "bytes": traffic(status),
        "site": site_link(status.get("site")),
        "ledger": status.get("ledger", {}),
        "tokens": status.get("tokens") or (records.summary or {}).get("tokens") or {},
        "job": job_phase(records, status),
        "degraded": status.get("degraded", []),
        "suspended": status.get("suspended", []),
        "regions": list(regions.values()),
        "dollars_per_hour": None if None in prices else round(sum(p for p in prices if p is not None), 4),
        "events": merged_events(status.get("events", []), records.events),
        "shards": status.get("shards"),
        "relays": relay_reading(status.get("relays")),
        "replanner": records.replanner,
    }


def job_phase(records: RunRecords, status: dict[str, Any]) -> dict[str, Any]:
    """Training, finishing or finished (with the result): ddctl's record wins once the controller has concluded."""
    if records.summary is not None:
        return {"phase": "finished", "reason": records.summary.get("reason", ""), "summary": records.summary}
    job = status.get("job") or {}
    phase = job.get("phase") if job.get("phase") in ("training", "finishing", "finished") else "training"
    return {"phase": phase, "reason": str(job.get("reason") or ""), "summary": job.get("summary")}


def rounds_per_min(recent: list[dict[str, Any]]) -> float | None:
    times = [float(r["t"]) for r in recent]
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return round(60 * (len(times) - 1) / (times[-1] - times[0]), 1)


def goodput(status: dict[str, Any]) -> float | None:
    """Share of learner time spent in training steps so far (``service.ending.goodput``, the summary's figure)."""
    return learner_goodput(status.get("learners", []), status.get("uptime_s"))


def traffic(status: dict[str, Any]) -> dict[str, Any]:
    """Bytes sent both ways, against what data-parallel training would have all-reduced for the same steps."""
    sent = status.get("bytes_up", 0) + status.get("bytes_down", 0)
    steps = sum(e.get("step", 0) for e in status.get("learners", []))
    dp = steps * status.get("parameters", 0) * DP_BYTES_PER_PARAM_STEP
    return {"sent": sent, "data_parallel": dp, "ratio": round(sent / dp, 6) if dp else None}


def site_link(raw: Any) -> dict[str, Any] | None:
    """The syncer's own reading of its site's link, Mbit/s each way (``core/sitemeter.py``); None until it has one."""
    site = site_reading(raw)
    return site if site["up_mbps"] is not None or site["down_mbps"] is not None else None


def merged_events(syncer: list[dict[str, Any]], local: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The syncer's events (joins, leaves, snapshots, recoveries) and ddctl's (notices, preemptions,
    replacements, errors) in one timeline, newest last."""
    out = [{"source": "syncer", **e} for e in syncer] + [
        {"source": "ddctl", "event": e.get("kind", "?"), **{k: v for k, v in e.items() if k != "kind"}}
        for e in local
        if e.get("kind") != "instance"  # state bookkeeping; the table shows states
    ]
    return sorted(out, key=lambda e: e.get("t", 0.0))[-EVENTS_KEPT:]


def _count(events: list[dict[str, Any]], kind: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        if e.get("kind") == kind and "instance" in e:
            counts[e["instance"]] = counts.get(e["instance"], 0) + 1
    return counts


def _ratio(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else round(min(part / whole, 1.0), 4)


def from_recording(raw: dict[str, Any], *, unreachable_for: float | None = None) -> dict[str, Any]:
    """A snapshot from a recording (``docs/record_dashboard.py``); ``unreachable_for`` replays the same
    moment as seen that many seconds later with the syncer gone quiet."""
    r = raw["records"]
    records = RunRecords(
        run=r["run"],
        provider=r["provider"],
        instances=[InstanceRecord(**i) for i in r["instances"]],
        events=r["events"],
        regions={k: RegionInfo(v["provider"], tuple(v["zones"]), v["dollars_per_hour"]) for k, v in r["regions"].items()},
    )
    view, now = SyncerView(**raw["syncer"]), float(raw["now"])
    if unreachable_for is not None:
        view = SyncerView(view.status, view.fetched_at, "GET /v1/status: ConnectError('connection refused')", view.url)
        now += unreachable_for
    return build(records, view, now)

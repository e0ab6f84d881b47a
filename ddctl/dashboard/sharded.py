"""A sharded synchronizer's statuses as one job's, in the shape one synchronizer answers (pure).

The dashboard draws a job, not a shard. Each shard counts its own fragments, so
what the job did is their sum (rounds, the ledger, bytes) and a fragment's
version is its owner's (one in the middle of a handoff, owned by none: the newest
any shard holds; one whose owner did not answer: unknown, None); a learner is
one learner whatever number of shards heard it, so what learners report (tokens
trained, the budget, their rows) is taken once, from the first shard that
answered (``control/shard_status.py`` says the same for ``ddctl syncer
status``). The job has finished when every shard has. Each shard's own figures
stay beside them, as ``shards``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ddctl.control.shard_status import BOOKS, job_figure, newest_held, relay_reading, summarize

PHASES = ("training", "finishing", "finished")


def job_status(answers: Sequence[tuple[str, dict[str, Any] | None, str]]) -> dict[str, Any] | None:
    """One status of the job from its shards' (url, status or None, why not) in shard order; None if none answered."""
    reached = [status for _, status, _ in answers if status is not None]
    if not reached:
        return None
    first = reached[0]
    named = [(str((s.get("shard") or {}).get("name", "")), s) for s in reached]  # each shard's events say whose they are
    tokens: dict[str, int] = {}
    for status in reached:
        tokens = {k: job_figure(k, tokens.get(k, 0), int(v)) for k, v in (status.get("tokens") or {}).items()}
    ledger: dict[str, Any] = {k: sum(int(s["ledger"][k]) for s in reached) for k in BOOKS}
    ledger["balanced"] = all(bool(s["ledger"]["balanced"]) for s in reached)
    summary = summarize(answers)  # each fragment's version at its owner (the newest epoch's claim), as syncer status says
    versions = summary["job"].get("versions") or [newest_held(reached, p) for p in range(len(first.get("versions", [])))]
    phases = [str((s.get("job") or {}).get("phase", "training")) for s in reached]
    phase = "finished" if all(p == "finished" for p in phases) and len(reached) == len(answers) else (
        "finishing" if any(p in ("finishing", "finished") for p in phases) else "training")  # fmt: skip
    return {
        **first,  # what every shard says alike: the run, the job's settings, the learners' own rows
        "uptime_s": max(float(s.get("uptime_s", 0.0)) for s in reached),
        "quorum_s": max(float(s.get("quorum_s", 0.0)) for s in reached),
        "rounds": sum(int(s.get("rounds", 0)) for s in reached),
        "versions": versions,
        "tokens": tokens,
        "ledger": ledger,
        "bytes_up": sum(int(s.get("bytes_up", 0)) for s in reached),
        "bytes_down": sum(int(s.get("bytes_down", 0)) for s in reached),
        "recent_rounds": sorted((r for s in reached for r in s.get("recent_rounds", [])), key=lambda r: float(r["t"])),
        "events": sorted((e | {"shard": name} for name, s in named for e in s.get("events", [])), key=_time),
        "degraded": [d for s in reached for d in s.get("degraded", [])],
        "suspended": sorted({name for s in reached for name in s.get("suspended", [])}),
        "job": {**(first.get("job") or {}), "phase": phase if phase in PHASES else "training"},
        "site": None,  # each shard reads its own site's link: the shards' rows say which
        "shards": summary["shards"],
        "relays": relays([s.get("relays") for s in reached]),
    }


def relays(answers: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Each region's relay as the job sees it: it pulls from every shard, so its streams and bytes are the shards'
    sum, it was last heard from (and is where it said then) by the shard that heard it last, and it serves the most
    learners any shard counts behind it (a learner that reads one shard's stream itself, while that shard's relay
    stream is down, is not behind it there)."""
    job: dict[str, dict[str, Any]] = {}
    for answer in answers:
        for region, feed in relay_reading(answer).items():
            seen = job.setdefault(region, {"streams": 0, "bytes": 0, "seen_s_ago": None, "address": "", "learners": None})
            seen["streams"] += feed["streams"]
            seen["bytes"] += feed["bytes"]
            if feed["learners"] is not None:  # every shard knows the region's learners: the most any reads it for
                seen["learners"] = max(seen["learners"] or 0, feed["learners"])
            ago = feed["seen_s_ago"]
            if seen["seen_s_ago"] is None or ago < seen["seen_s_ago"]:
                seen["seen_s_ago"], seen["address"] = ago, feed["address"] or seen["address"]
    return dict(sorted(job.items()))


def _time(event: dict[str, Any]) -> float:
    return float(event.get("t", 0.0))

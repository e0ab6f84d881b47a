"""What an event of the run's log says, in words: the synchronizer's (joins, leaves, snapshots, recoveries) and
ddctl's own (failover, preemptions, give-ups). Pure: ``render`` draws the words.

An event is another process's record, so a field missing or not of its kind (a None val_bpb) never raises: the
event is then said as its fields, ``key=value``.
"""

from __future__ import annotations

from typing import Any

EVENT_FORMATS = {
    "run-training": "the run is training",
    "join": "{learner} joined ({region})",
    "leave": "{learner} left ({reason})",
    "started": "syncer started on a fresh state",
    "finishing": "the job is finishing: {reason}",
    "finished": "the job finished: {reason}",
    "snapshot": "snapshot of {bytes} in {seconds:.2f}s",
    "recovered": "syncer recovered: snapshot of log segment {wal_segment}, {replayed} log records replayed",
    "recovered-from-log": "syncer recovered from its log alone: {replayed} records replayed",
    "created": "{instance} ({region}) created: {reason}",
    "provision-failed": "{instance} could not start ({error}): {reason}",
    "preemption-notice": "{instance} ({region}) spot notice, {notice_s}s",
    "preempted": "{instance} ({region}) preempted",
    "replaced": "{instance} ({region}) replaced",
    "terminate": "{instance} ({region}) terminated: {reason}",
    "wait": "{reason}",
    "give_up": "{reason}",
    "stop": "the job is asked to stop: {reason}",
    "instance": "{instance} {state}",
    "error": "{where}: {message}",
    "error-of": "{instance}: {reason}",
    "rejected": "{learner}: update refused ({code}): {reason}",
    "set-aside": "{learner}: fragment {fragment} contribution set aside: {reason}",
    "suspended": "{learner} suspended: {reason}",
    "readmitted": "{learner} readmitted",
    "fragment-degraded": "fragment {fragment} degraded: {reason}",
    "task-failed": "syncer task {task} failed and restarted: {reason}",
    "partition": "{region} cut off from the syncer for {seconds}s",
    "partition-healed": "{region} connected again after {seconds}s",
    "replan": "re-plan: {moves}: {cause}",
    "checkpoint": "checkpoint {name}: round {rounds}, val_bpb {val_bpb:.4f}, {bytes} in {seconds:.1f}s",
}
"""Each kind's words. ``recovered-from-log`` and ``error-of`` are other shapes of ``recovered`` (no snapshot) and of
``error`` (ddctl's own about an instance, where the synchronizer's name a place and a message)."""
ALARMS = (
    "preempted", "error", "leave", "rejected", "set-aside", "suspended", "fragment-degraded", "task-failed", "partition",
    "give_up", "provision-failed",
)  # fmt: skip


def sized(n: float) -> str:
    """A byte count in decimal units: 512 B, 2.4 MB."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def said(e: dict[str, Any]) -> tuple[str, str]:
    """(what event ``e`` says, its style): red for alarms, yellow for notices, green for good news."""
    fields = {k: v for k, v in e.items() if k not in ("t", "event", "source", "shard")}
    if isinstance(fields.get("bytes"), int):
        fields["bytes"] = sized(fields["bytes"])
    kind = e["event"]
    chosen = "recovered-from-log" if kind == "recovered" and not fields.get("snapshot") else kind
    chosen = "error-of" if kind == "error" and "instance" in fields else chosen
    try:
        detail = EVENT_FORMATS[chosen].format(**fields)
    except (KeyError, IndexError, ValueError, TypeError):  # a field missing or not of its kind (a None val_bpb)
        detail = " ".join(f"{k}={v}" for k, v in fields.items() if v not in (None, ""))
    calm = kind == "leave" and fields.get("reason") in ("finished", "stopped")  # a learner done with its share
    good = kind in ("join", "readmitted", "finished")
    style = "" if calm else "red" if kind in ALARMS else "yellow" if "notice" in kind else "green" if good else ""
    whose = f"{e['shard']}: " if e.get("shard") else ""  # which shard of a sharded synchronizer said it
    return f"{whose}{detail or kind}", style

"""A simulated run's learner availability as an event tape, and back into outages for ``ddctl train``.

The tape is the project's event-tape format (a config record, then
``failure`` and ``join`` records per learner, then ``end``), so the same
failure timeline can drive a real (small) training run: ``ddctl train
--failures PATH`` makes each learner disappear and return at the recorded
virtual times.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ddctl.config.train import Outage
from ddctl.goodput.params import SimParams
from ddctl.goodput.system import CellRun
from ddctl_agents.core.tape import TAPE_FORMAT, TapeWriter, read_tape
from ddctl_agents.errors import TapeError


def away_intervals(run: CellRun, seconds: float) -> list[tuple[int, float, float]]:
    """(learner, left at, back at) for every stretch a learner was not training, within ``seconds``."""
    out = []
    for index, unit in enumerate(run.units):
        cursor = 0.0
        for start, end in zip(unit.seg_start, unit.seg_end, strict=True):
            if start > cursor and cursor < seconds:
                out.append((index, cursor, start))
            cursor = end
        if cursor < seconds:
            out.append((index, cursor, float("inf")))
    return sorted((i, a, b) for i, a, b in out if a < seconds)


def write_tape(path: Path, run: CellRun, p: SimParams, seconds: float) -> int:
    """Write the availability tape of ``run``'s learners over its first ``seconds``; returns the outages."""
    if path.exists():
        raise FileExistsError(f"{path} exists; the tape is written to a new file")
    intervals = away_intervals(run, seconds)
    records: list[dict[str, Any]] = []
    incarnation = [0] * len(run.units)
    for learner, left, back in intervals:
        records.append({"type": "failure", "t": round(left, 6), "learner": f"L{learner}", "incarnation": incarnation[learner]})
        if back <= seconds:
            incarnation[learner] += 1
            again = incarnation[learner]
            records.append({"type": "join", "t": round(back, 6), "learner": f"L{learner}", "incarnation": again, "start_step": 0})
    records.sort(key=lambda r: (r["t"], r["type"] != "failure"))
    with TapeWriter(path) as tape:
        tape.write(
            {
                "type": "config",
                "format": TAPE_FORMAT,
                "source": "ddctl simulate",
                "system": run.system,
                "chips": run.chips,
                "learners": len(run.units),
                "seed": run.seed,
                "seconds": seconds,
                "params": asdict(p),
            }
        )
        for record in records:
            tape.write(record)
        tape.write({"type": "end", "t": seconds})
    return len(intervals)


def outages_from_tape(path: Path, learners: int) -> tuple[Outage, ...]:
    """Each learner's failure, paired with its next join, as an Outage (no join: it never returns)."""
    open_at: dict[int, float] = {}
    outages: list[Outage] = []
    for record in read_tape(path):
        if record["type"] not in ("failure", "join"):
            continue
        name, t = str(record.get("learner", "")), record.get("t")
        if not name.startswith("L") or not name[1:].isdigit() or not isinstance(t, int | float) or t < 0:
            raise TapeError(f"{path}: a {record['type']} record needs learner 'L<i>' and a time t >= 0, got {record}")
        index = int(name[1:])
        if index >= learners:
            raise TapeError(f"{path}: the tape has learner {name} but the run has {learners} learners (L0..L{learners - 1})")
        if record["type"] == "failure":
            open_at.setdefault(index, float(t))
        elif index in open_at and t > open_at[index]:
            left = open_at.pop(index)
            outages.append(Outage(learner=index, at=left, duration=float(t) - left))
    outages += [Outage(learner=i, at=at) for i, at in open_at.items()]
    return tuple(sorted(outages, key=lambda o: (o.at, o.learner)))

"""``ddctl bench cadence``: a learner on a slow link, sending every period against every k-th.

Real processes: a syncer on the host end of a veth pair, L0 on the host (unshaped), L1 in a
network namespace whose link is shaped with ``tc tbf`` both ways. Each cadence is a fresh
job of the same budget, one after another in the same run (this machine is noisy: compare
rows, not absolute times). Per cadence: L1's traffic against the link, how much of what
it trained reached the model, and the final model's val_bpb.

- ``link_load``: L1's busier direction, bytes over its training wall time, against the
  shaped rate (> 1: the link cannot carry that cadence; its transfers queue).
- ``l1_efficiency``: of the fragment-tokens L1 trained, the share the syncer accepted into
  a round (fresh or late); the rest was overwritten by versions adopted before it was
  sent, dropped as too stale, or never sent.
- ``job_efficiency``: the same for both learners together, from the syncer's ledger
  (merged + late-merged over what the learners trained).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddctl.errors import DdctlError
from ddctl.local.service import LocalSyncer, tiny_job
from ddctl.providers.linkshape import ShapedLink, shaped_link
from ddctl_agents.core.schedule import CADENCES
from ddctl_agents.waiting import wait_until

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
ACCEPTED = ("accepted", "late")
MAX_BEHIND = 1
"""The late-update allowance this benchmark's tables were taken with (a job's default is 0). At 0, L1 at cadence 4
on the loaded link also loses the updates that land past its k - 1 versions, and each drop costs a resync's bytes
down: L1's bytes at cadence 4 were 0.77x cadence 1's in one run, against 0.65x or less at 1."""


def measure_cadence(
    rate_mbit: float = 4.0, cadences: Sequence[int] = (1, 2, 4), tokens: int = 300_000, parallel: int = 3
) -> dict[str, Any]:
    """One row per cadence of L1 (L0 at 1), each a fresh job over the same shaped link; ``parallel``: L1's uploads
    in flight at once."""
    if not cadences or any(k not in CADENCES for k in cadences):
        raise DdctlError(f"cadences must be some of {', '.join(map(str, CADENCES))}, got {list(cadences)}")
    if tokens < 50_000:
        raise DdctlError(f"tokens must be >= 50000 (a few periods per learner), got {tokens}")
    if not 1 <= parallel <= 8:
        raise DdctlError(f"parallel must be in [1, 8] uploads in flight, got {parallel}")
    rows = []
    with shaped_link(f"ddctl-cad-{os.getpid()}", rate_mbit, rate_mbit) as link:
        for k in cadences:
            rows.append(_one(link, k, tokens, parallel))
    first = rows[0]
    for row in rows:
        row["x_first"] = {
            "l1_bytes": round(row["l1"]["bytes"] / first["l1"]["bytes"], 4),
            "l1_efficiency": round(row["l1_efficiency"] / first["l1_efficiency"], 4) if first["l1_efficiency"] else None,
        }
    return {"rate_mbit": rate_mbit, "tokens": tokens, "parallel": parallel, "learners": 2, "preset": "tiny", "rows": rows}


def _one(link: ShapedLink, cadence: int, tokens: int, parallel: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ddctl-cad-") as tmp:
        root = Path(tmp)
        job = tiny_job(learners=2, tokens=tokens)
        job = dataclasses.replace(job, syncer=dataclasses.replace(job.syncer, max_behind=MAX_BEHIND))
        with LocalSyncer(root, job, run="cadence-bench", host=link.host_ip) as syncer:
            syncer.start("--snapshot-every", "3600")
            started = time.monotonic()
            procs = {
                "L0": _learner(syncer, root, "L0", ("--cadence", "1"), wrap=lambda argv: argv),
                "L1": _learner(
                    syncer,
                    root,
                    "L1",
                    ("--cadence", str(cadence), "--parallel-uploads", str(parallel)),
                    wrap=lambda argv: link.command(*argv),
                ),  # fmt: skip
            }
            for name, proc in procs.items():
                if proc.wait(timeout=900) != 0:
                    raise DdctlError(f"learner {name} exited {proc.returncode}: {(root / f'{name}.log').read_text()[-2000:]}")
            wall = time.monotonic() - started
            status = _finished(syncer)
            summaries = {name: _summary(root, name) for name in procs}
    return _row(cadence, link, wall, status, summaries)


def _learner(syncer: LocalSyncer, root: Path, name: str, extra: Sequence[str], wrap: Any) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "ddctl_agents.agent", "--syncer", syncer.url, "--name", name, "--token", syncer.token(name)]
    argv += ["--ca", str(syncer.ca), "--summary", str(root / f"{name}.summary.json"), "--region", name, *extra]
    with (root / f"{name}.log").open("ab") as log:
        return subprocess.Popen(wrap(argv), stdout=log, stderr=log, env=ENV)


def _finished(syncer: LocalSyncer) -> dict[str, Any]:
    """The syncer's status once the job has finished (its last rounds merged, its final model evaluated)."""
    client = syncer.client()
    try:
        return dict(wait_until(lambda: (s := client.status())["job"]["phase"] == "finished" and s, timeout_s=120, what="the end"))
    finally:
        client.close()


def _summary(root: Path, name: str) -> dict[str, Any]:
    return dict(json.loads((root / f"{name}.summary.json").read_text()))


def _row(cadence: int, link: ShapedLink, wall: float, status: dict[str, Any], s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    l1 = s["L1"]
    moved = {"up": l1["bytes_up"], "down": l1["bytes_down"]}
    seconds = max(l1["train_seconds"], 1e-9)
    load = max(
        moved["up"] * 8 / seconds / 1e6 / link.up_mbit, moved["down"] * 8 / seconds / 1e6 / (link.down_mbit or link.up_mbit)
    )
    accepted = sum(l1["acked_tokens"].get(k, 0) for k in ACCEPTED)
    [seen] = [row for row in status["learners"] if row["id"] == "L1"]
    uploads = sum(n for fate, n in seen["updates"].items() if fate != "duplicate")  # a retried copy is no new update
    ledger, trained = status["ledger"], sum(x["trained_tokens"] for x in s.values())
    return {
        "cadence": cadence,
        "val_bpb": (status["job"]["summary"] or {}).get("val_bpb"),
        "wall_s": round(wall, 1),
        "l1": {
            "bytes": moved["up"] + moved["down"],
            "bytes_up": moved["up"],
            "bytes_down": moved["down"],
            "train_seconds": l1["train_seconds"],
            "trained_tokens": l1["trained_tokens"],
            "accepted_tokens": accepted,
            "overwritten_tokens": l1["overwritten_tokens"],
            "acked_tokens": dict(l1["acked_tokens"]),
            "uploads": uploads,
            "absorbed": l1["absorbed_updates"],
            "updates": uploads + l1["absorbed_updates"],
        },
        "link_load": round(load, 4),
        "l1_efficiency": round(accepted / l1["trained_tokens"], 4) if l1["trained_tokens"] else None,
        "job_efficiency": round((ledger["merged"] + ledger["late_merged"]) / trained, 4) if trained else None,
        "ledger": {k: ledger[k] for k in ("received", "merged", "late_merged", "dropped", "rejected", "balanced")},
    }

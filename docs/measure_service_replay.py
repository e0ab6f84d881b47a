"""Run a real synchronizer service with real learner processes, then replay its tape; print one JSON object.

    .venv/bin/python docs/measure_service_replay.py [--learners M] [--tokens N] [--inner-steps H] [--parallel auto|N]
        [--up-mbit X]

``--up-mbit``: the learners run in one network namespace whose link is shaped with tc tbf (root; see
``ddctl/providers/linkshape.py``), so their uploads queue and queued updates absorb newer ones.

What it shows: the run's and the replay's wall times, whether the replay reproduced the service's final
model bit for bit (the tape's end hash, and the hash of the checkpoint ``ddctl pull`` would fetch), and how
many updates arrived out of the order their learner made them or carried updates they had absorbed: the
cases a replay in arrival order would get wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from ddctl.local.replay import replay_tapes
from ddctl.local.service import LocalSyncer, tiny_job
from ddctl.providers import linkshape
from ddctl_agents.core.tape import read_tape
from ddctl_agents.train.checksum import params_sha256
from ddctl_agents.waiting import wait_until


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=80_000)
    parser.add_argument("--inner-steps", type=int, default=8)
    parser.add_argument("--parallel", default="3", help="each learner's --parallel-uploads")
    parser.add_argument("--up-mbit", type=float, default=0.0, help="the learners' shared uplink (0: loopback, unshaped)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, contextlib.ExitStack() as stack:
        link = stack.enter_context(linkshape.shaped_link("ddrp", args.up_mbit)) if args.up_mbit else None
        summary, run_s = run_job(Path(root), args, link)
        tape = Path(summary["state_dir"]) / "tape.jsonl"
        replayed = replay_tapes([tape])
        model = load_file(str(Path(summary["checkpoint"]) / "model.safetensors"))
        print(json.dumps(figures(tape) | {
            "run_wall_s": round(run_s, 2),
            "replay_wall_s": round(replayed["wall_s"], 2),
            "match": replayed["match"],
            "checkpoint_matches": replayed["params_sha256"] == params_sha256(model),
            "val_bpb": summary["val_bpb"],
            "replayed_val_bpb": round(replayed["val_bpb"], 5),
            "lost_updates": replayed["lost_updates"],
        }, indent=2))  # fmt: skip


def run_job(root: Path, args: argparse.Namespace, link: linkshape.ShapedLink | None) -> tuple[dict[str, Any], float]:
    job = tiny_job(learners=args.learners, tokens=args.tokens, inner_steps=args.inner_steps)
    syncer = LocalSyncer(root, job, run="replay-measure", host=link.host_ip if link else "127.0.0.1")
    started = time.monotonic()
    syncer.start("--linger", "3")
    learners = []
    try:
        for i in range(args.learners):
            name = f"L{i}"
            command = [*(link.command() if link else []), sys.executable, "-m", "ddctl_agents.agent",
                       "--syncer", syncer.url, "--name", name, "--token", syncer.token(name), "--ca", str(syncer.ca),
                       "--parallel-uploads", args.parallel]  # fmt: skip
            with (root / f"{name}.log").open("ab") as log:
                learners.append(subprocess.Popen(command, stdout=log, stderr=log))
        for learner in learners:
            if learner.wait(timeout=600) != 0:
                raise SystemExit(f"a learner failed; logs in {root}")

        def finished() -> dict[str, Any] | None:
            client = syncer.client()
            try:
                status = client.status()
            finally:
                client.close()
            return status["job"]["summary"] if status["job"]["phase"] == "finished" else None

        summary = wait_until(finished, timeout_s=120, every_s=0.2, what="the job to finish")
        return summary, time.monotonic() - started
    finally:
        for learner in learners:
            learner.kill()
        syncer.kill()


def figures(tape: Path) -> dict[str, int]:
    """Updates on the tape, those that arrived before one their learner made earlier, and those carrying others."""
    updates = [r for r in read_tape(tape) if r["type"] == "update"]
    latest: dict[str, int] = {}
    reordered = 0
    for record in updates:
        prefix, _, number = record["update_id"].rpartition(".")
        reordered += int(number) < latest.get(prefix, -1)
        latest[prefix] = max(latest.get(prefix, -1), int(number))
    return {
        "updates": len(updates),
        "arrived_out_of_order": reordered,
        "absorbing": sum(bool(r.get("absorbed")) for r in updates),
        "absorbed": sum(len(r.get("absorbed", [])) for r in updates),
    }


if __name__ == "__main__":
    main()

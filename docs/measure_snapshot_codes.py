"""The size and time of a synchronizer's snapshot while a round holds M packed int4 updates.

One 8,388,608-parameter fragment (8 tensors, ``ddctl bench syncer``'s), M = 8 learners' int4 updates received and
the round still open: what a periodic snapshot finds mid-round. It prints the snapshot's bytes, the bytes of the
pending updates in it, their bytes on the wire, and the best of ``--repeats`` timings of ``capture`` (on the core
thread in the service) and of ``to_bytes`` (on the disk thread). Run it from two trees to compare, e.g. a commit
checked out beside this one (``git worktree add OLD REV``, ``(cd OLD && python setup.py -q build_ext --inplace)``):

    .venv/bin/python docs/measure_snapshot_codes.py [--repeats 5]
    PYTHONPATH=OLD:OLD/agents .venv/bin/python OLD/docs/measure_snapshot_codes.py  # or this file, run there
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from ddctl.bench.rounds import _frames, _syncer
from ddctl_agents.core.messages import decode_update
from ddctl_agents.core.syncer_state import capture


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    syncer = _syncer(8 * 2**20, 8, 8)
    frames = _frames(syncer, 8)
    for m, frame in enumerate(frames):
        update = decode_update(frame)[0]
        syncer.receive(1.0, dataclasses.replace(update, learner=f"L{m}", update_id=f"0.{m}"))
    capture_s, bytes_s = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        state = capture(syncer, {})
        captured = time.perf_counter()
        data = state.to_bytes()
        capture_s.append(captured - started)
        bytes_s.append(time.perf_counter() - captured)
    codes = sum(4 * t.numel() for k, t in state.tensors.items() if k.startswith("k/"))
    print(json.dumps({
        "pending_updates": len(syncer.rounds[0].fresh),
        "snapshot_bytes": len(data),
        "pending_bytes_in_snapshot": codes,
        "pending_bytes_on_the_wire": sum(len(f) for f in frames),
        "capture_s": round(min(capture_s), 4),
        "to_bytes_s": round(min(bytes_s), 4),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

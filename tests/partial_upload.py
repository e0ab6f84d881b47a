"""A learner that dies mid-upload: registers, sends half of a valid update, then hangs until killed.

Run as ``python -m tests.partial_upload URL TOKEN CA MARKER``; MARKER is written
once half the body is on the wire.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.core.messages import Update, encode_update
from ddctl_agents.jsonable import from_json
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.job import JobConfig


def main(url: str, token: str, ca: str, marker: str) -> None:
    client = SyncerClient(url, token, Path(ca))
    job = from_json(JobConfig, client.job()["job"])
    client.register("L2", 1, "doomed")
    assembly = Assembly.build(job)
    tensors = {s.name: torch.full(s.shape, 1e-3) for s in assembly.fragmentation.fragments[0]}
    update = Update(
        learner="L2", fragment=0, base_version=0, update_id="L2.1.0", step=8, c_steps=8, c_tokens=8192, tensors=tensors
    )
    frame = encode_update(update, "fp32", 64)  # large, so half of it is a real partial upload

    def half_then_hang() -> Iterator[bytes]:
        half = len(frame) // 2
        for i in range(0, half, 16384):
            yield frame[i : min(i + 16384, half)]
        Path(marker).write_text("half sent")
        time.sleep(3600)
        yield frame[half:]

    client.http.post(f"{url}/v1/updates", content=half_then_hang(), headers={"content-length": str(len(frame))})


if __name__ == "__main__":
    main(*sys.argv[1:5])

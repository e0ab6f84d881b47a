"""``ddctl bench link``: goodput of fragment uploads over a link shaped to a fixed rate.

A real syncer listens on the host end of a veth pair; a learner-side client in a
network namespace pushes int4 updates through a ``tc tbf`` uplink. Goodput is
frame bytes per second of acknowledged upload (transfer, decode, fsync, ack
included), against the shaped rate. The syncer's own bandwidth tracker
estimate for the link is reported beside it.

The client half runs inside the namespace as ``python -m ddctl.bench.link``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ddctl.bench.transport import transport_job
from ddctl.errors import DdctlError
from ddctl.local.service import LocalSyncer
from ddctl.providers.linkshape import shaped_link
from ddctl_agents.agent.client import SyncerClient, retry
from ddctl_agents.train.job import JobConfig


def link_job(preset: str) -> JobConfig:
    """The transport benchmark's job with one fragment: each send is the whole model."""
    return transport_job(preset, fragments=1)


def measure_link(rate_mbit: float = 80.0, uploads: int = 6, preset: str = "small", parallel: int = 3) -> dict[str, Any]:
    """Upload ``uploads`` int4 updates through a ``rate_mbit`` uplink; goodput as a fraction of the rate."""
    if uploads < 1:
        raise DdctlError(f"uploads must be >= 1, got {uploads}")
    name = f"ddctl-link-{os.getpid()}"
    with (
        tempfile.TemporaryDirectory(prefix="ddctl-link-") as tmp,
        shaped_link(name, rate_mbit) as link,
        LocalSyncer(Path(tmp), link_job(preset), run="link-bench", host=link.host_ip) as syncer,
    ):
        syncer.start("--snapshot-every", "3600")
        url = syncer.url
        command = link.command(
            sys.executable, "-m", "ddctl.bench.link", url, syncer.token("L0"), str(syncer.ca), str(uploads), str(parallel)
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if done.returncode != 0:
            log = syncer.log_path.read_text(errors="replace")[-3000:]
            raise DdctlError(f"the upload client failed: {done.stderr[-2000:]}\nsyncer log:\n{log}")
        client_result = json.loads(done.stdout.strip().splitlines()[-1])
        admin = syncer.client()
        try:
            tracked = next(entry for entry in admin.status()["learners"] if entry["id"] == "L0")["up_mbps"]
        finally:
            admin.close()
    goodput = client_result["goodput_mbit"]
    return {
        "rate_mbit": rate_mbit,
        "goodput_mbit": round(goodput, 2),
        "goodput_fraction": round(goodput / rate_mbit, 4),
        "tracker_up_mbit": tracked,
        "tracker_fraction": round(tracked / rate_mbit, 4) if tracked else None,
        "frame_bytes": client_result["frame_bytes"],
        "uploads": uploads,
        "parallel": parallel,
        "seconds": client_result["seconds"],
    }


def _client(url: str, token: str, ca: str, uploads: int, parallel: int) -> dict[str, Any]:
    """Inside the namespace: register, then push ``uploads`` int4 updates, ``parallel`` at a time."""
    import torch

    from ddctl_agents.core.messages import Update, decode_fragment, encode_update

    client = SyncerClient(url, token, Path(ca))
    client.register("L0", 1, "shaped")
    shapes = decode_fragment(client.http.get(f"{url}/v1/fragments/0").content)[0].tensors
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(t.shape, generator=g) * 1e-3 for n, t in shapes.items()}
    base = int(client.http.get(f"{url}/v1/vclock").json()["versions"][0])

    def frame(i: int) -> bytes:
        update = Update(
            learner="L0", fragment=0, base_version=base, update_id=f"L0.1.{i}", step=8, c_steps=8, c_tokens=8, tensors=tensors
        )
        return encode_update(update, "int4", 64)

    client.push(frame(0), 0)  # warms TCP's window
    frames = [frame(i) for i in range(1, uploads + 1)]
    local = threading.local()

    def push(f: bytes) -> None:  # one connection per uploader thread, as in the learner's Comms
        if not hasattr(local, "client"):
            local.client = SyncerClient(url, token, Path(ca))
        retry(lambda: local.client.push(f, 0))

    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(push, frames))
    seconds = time.perf_counter() - started
    client.close()
    total = sum(len(f) for f in frames)
    return {"goodput_mbit": total * 8 / seconds / 1e6, "frame_bytes": len(frames[0]), "seconds": round(seconds, 3)}


if __name__ == "__main__":
    print(json.dumps(_client(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))

"""``ddctl bench link``: goodput of fragment uploads over a link shaped to a fixed rate.

A real syncer listens on the host end of a veth pair; a learner-side client in a
network namespace pushes int4 updates through a ``tc tbf`` uplink. Goodput is
frame bytes per second of acknowledged upload (transfer, decode, fsync, ack
included), against the shaped rate. The syncer's own bandwidth tracker
estimate for the link is reported beside it: the uplink the learner's kernel timed, as its heartbeats
report it (``tracker_timed_by`` says so).

The client half runs inside the namespace as ``python -m ddctl.bench.link``: the learner's own
``Comms`` (its uploaders, in-flight slots and link timing), with every update queued at once, so
the uploads in flight decide both goodput and how soon the first update is acknowledged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ddctl.bench.transport import transport_job
from ddctl.errors import DdctlError
from ddctl.local.service import LocalSyncer
from ddctl.providers.linkshape import shaped_link
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.core.pacing import in_flight_text
from ddctl_agents.train.job import JobConfig

TOKENS_PER_UPDATE = 8
"""Each update's fragment-tokens: the learner's ledger counts in them, so acknowledged updates are its count over this."""


def link_job(preset: str) -> JobConfig:
    """The transport benchmark's job with one fragment: each send is the whole model."""
    return transport_job(preset, fragments=1)


def measure_link(rate_mbit: float = 80.0, uploads: int = 6, preset: str = "small", parallel: int | None = 3) -> dict[str, Any]:
    """Upload ``uploads`` int4 updates through a ``rate_mbit`` uplink; goodput as a fraction of the rate.

    ``parallel``: uploads in flight, as the learner's ``--parallel-uploads`` (None: auto, paced)."""
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
        in_flight = in_flight_text(parallel)
        command = link.command(
            sys.executable, "-m", "ddctl.bench.link", url, syncer.token("L0"), str(syncer.ca), str(uploads), in_flight
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if done.returncode != 0:
            log = syncer.log_path.read_text(errors="replace")[-3000:]
            raise DdctlError(f"the upload client failed: {done.stderr[-2000:]}\nsyncer log:\n{log}")
        client_result = json.loads(done.stdout.strip().splitlines()[-1])
        admin = syncer.client()
        try:
            learner = next(entry for entry in admin.status()["learners"] if entry["id"] == "L0")
        finally:
            admin.close()
    goodput, tracked = client_result["goodput_mbit"], learner["up_mbps"]
    return {
        "rate_mbit": rate_mbit,
        "goodput_mbit": round(goodput, 2),
        "goodput_fraction": round(goodput / rate_mbit, 4),
        "tracker_up_mbit": tracked,
        "tracker_fraction": round(tracked / rate_mbit, 4) if tracked else None,
        "tracker_timed_by": learner["up_timed_by"],
        "frame_bytes": client_result["frame_bytes"],
        "uploads": uploads,
        "parallel": in_flight,
        "in_flight_cap": client_result["cap"],
        "seconds": client_result["seconds"],
        "first_ack_s": client_result["acks_s"][0],
        "median_ack_s": client_result["acks_s"][len(client_result["acks_s"]) // 2],
    }


def compare_in_flight(rate_mbit: float, uploads: int, preset: str, arms: list[int | None]) -> dict[str, Any]:
    """``measure_link`` for each in-flight setting in one run; each against the first (its baseline)."""
    if not arms:
        raise DdctlError("give at least one --parallel setting")
    runs = [measure_link(rate_mbit, uploads, preset, parallel) for parallel in arms]
    base = runs[0]
    for run in runs:
        run["goodput_x_baseline"] = round(run["goodput_mbit"] / base["goodput_mbit"], 3)
        run["first_ack_x_baseline"] = round(run["first_ack_s"] / base["first_ack_s"], 3)
        run["median_ack_x_baseline"] = round(run["median_ack_s"] / base["median_ack_s"], 3)
    return {"rate_mbit": rate_mbit, "uploads": uploads, "preset": preset, "baseline": base["parallel"], "runs": runs}


def _client(url: str, token: str, ca: str, uploads: int, in_flight: str) -> dict[str, Any]:
    """Inside the namespace: the learner's own ``Comms`` pushes ``uploads`` int4 updates queued at once.

    Each update's acknowledgement time is read off the learner's ledger as it grows."""
    import torch

    from ddctl_agents.agent.comm import Comms, Identity
    from ddctl_agents.agent.routes import Routes
    from ddctl_agents.core.messages import Update, decode_fragment, encode_update
    from ddctl_agents.core.pacing import parse_in_flight

    client = SyncerClient(url, token, Path(ca))
    shapes = decode_fragment(client.http.get(f"{url}/v1/fragments/0").content)[0].tensors
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(t.shape, generator=g) * 1e-3 for n, t in shapes.items()}
    base = int(client.http.get(f"{url}/v1/vclock").json()["versions"][0])
    client.close()
    me = Identity(name="L0", incarnation=1, region="shaped")
    comms = Comms(lambda u: SyncerClient(u, token, Path(ca)), Routes({"": url}), me, "int4", 64,
                  parallel_uploads=parse_in_flight(in_flight), absorb=False)  # fmt: skip
    comms.start(fragments=1)
    # As a training learner does: its heartbeats carry the uplink its kernel timed, so the syncer's tracker
    # reads that, not its own fallback (chunks timed as they arrive, which reads high on a busy reader).
    comms.set_report(step=8, step_time=1.0, tokens=0, tokens_per_s=0.0)

    def update(i: int) -> Update:
        return Update(learner="L0", fragment=0, base_version=base, update_id=f"L0.1.{i}", step=8, c_steps=8,
                      c_tokens=TOKENS_PER_UPDATE, tensors=tensors)  # fmt: skip

    comms.send(update(0))  # warms TCP's window
    if not comms.drain(120.0):
        raise SystemExit("the warm-up upload was not acknowledged in 120 s")
    acks: list[float] = []
    started = time.perf_counter()
    for i in range(1, uploads + 1):
        comms.send(update(i))
    while len(acks) < uploads and time.perf_counter() - started < 600:
        try:
            answered = comms.ledger.acked_total() + comms.ledger.rejected
            done = answered // TOKENS_PER_UPDATE - 1  # less the warm-up
        except RuntimeError:  # an uploader added a status while we summed: read again
            continue
        acks += [time.perf_counter() - started] * (done - len(acks))
        time.sleep(0.002)
    seconds = time.perf_counter() - started
    if len(acks) < uploads:
        raise SystemExit(f"only {len(acks)} of {uploads} uploads were acknowledged in 600 s")
    cap = comms.slots.cap()
    time.sleep(3 * comms.interval_s)  # the heartbeats after the last acknowledgement carry its timing
    comms.close(reason=None)
    frame_bytes = len(encode_update(update(1), "int4", 64))
    return {"goodput_mbit": frame_bytes * uploads * 8 / seconds / 1e6, "frame_bytes": frame_bytes, "seconds": round(seconds, 3),
            "acks_s": [round(t, 3) for t in acks], "cap": cap}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(_client(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])))

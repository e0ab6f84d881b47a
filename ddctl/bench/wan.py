"""``ddctl bench wan``: the four layouts of ``bench/wan_layouts.py`` run over one emulated WAN, one after another.

Real processes: the shards (or the one synchronizer) in their sites' namespaces, and
eight learners in theirs with ``--synthetic-step`` (the real schedule, counters, codecs
and comms; no training), over ``bench/wannet.py``'s shaped links. Each layout is a
fresh job of the same budget. Per layout:

- ``efficiency``: merged + late-merged over trained fragment-tokens, from the shards'
  ledgers (summed: each counts its own fragments) and the learners' summaries, and
  ``fresh``, the merged alone (in the round of their base version: a late update was
  computed from a version that has since moved on, and is worth less); per
  region, the share of its learners' trained tokens the shards accepted (their acks)
  and its send-to-adoption round trips (``agent/roundtrip.py``);
- ``sites``: each site's measured utilisation (the tbf counters' bytes over the steady
  window, against the link rate, the busier direction) beside the link model's
  prediction for the layout, from the plan's priors and from what the learners measured;
- ``balanced``: whether every shard's ledger balances;
- ``relays``: what each region's relay pulled in and served to its learners (bytes).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ddctl.bench.wan_layouts import LAYOUTS, Layout, WanCase, at_pace, layout_job, layouts, predict
from ddctl.bench.wannet import Wan, WanRegion, wan
from ddctl.config.synchronizer import traffic
from ddctl.control.shard_status import summarize
from ddctl.errors import DdctlError
from ddctl.local.relay import LocalRelay
from ddctl.local.service import LocalSyncer
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.core import shardmap
from ddctl_agents.core.pacing import in_flight_text
from ddctl_agents.waiting import ready_file, wait_until

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
START_FILE = "start"
"""The file learners started ``together`` wait for (``--start-when``)."""
ACCEPTED = ("accepted", "late")


def measure_wan(case: WanCase, names: Sequence[str] = LAYOUTS, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every named layout of ``case``, each a fresh job over the same emulated WAN; ``say`` hears each stage."""
    chosen = layouts(case, names)
    rows = []
    say(f"building the WAN: {len(case.links)} regions behind a router, links shaped with tc tbf")
    with wan(f"ddwan{os.getpid() % 100000}", case.links) as net:
        for i, layout in enumerate(chosen, 1):
            budget = (
                f"{case.train_tokens:,} tokens of training" if case.train_tokens else f"{case.seconds:g} s of synthetic steps"
            )
            say(f"layout {layout.name} ({i} of {len(chosen)}): {len(layout.shard_sites)} shard(s), {budget}")
            rows.append(_run_layout(net, case, layout))
            bpb = f", val_bpb {rows[-1]['val_bpb']:.4f}" if case.train_tokens else ""
            say(f"layout {layout.name}: efficiency {rows[-1]['efficiency']:.3f}{bpb}, books balanced: {rows[-1]['balanced']}")
    first = rows[0]
    for row in rows:
        row["x_first"] = round(row["efficiency"] / first["efficiency"], 4) if first["efficiency"] else None
    return {
        "case": {
            "links_mbit": case.links,
            "learners": case.learners,
            "step_s": case.step_s,
            "seconds": case.seconds,
            "preset": case.preset,
            "fragments": case.fragments,
            "inner_steps": case.inner_steps,
            "train_tokens": case.train_tokens,
            "max_behind": case.max_behind,
        },
        "rows": rows,
    }


def _run_layout(net: Wan, case: WanCase, layout: Layout) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ddctl-wan-") as tmp:
        root = Path(tmp)
        shards = start_shards(root, net, case, layout)
        relays: dict[str, LocalRelay] = {}
        try:
            relays = start_relays(net, layout, shards)
            learners = start_learners(root, net, case, layout, shards, together=True, relays=relays)
            try:
                window = steady_window(net, case, shards, learners, root, together=True)
            finally:
                for proc in learners.values():
                    if proc.poll() is None:
                        proc.kill()
            statuses = [finished_status(s) for s in shards]
            carried = {region: relay.health() for region, relay in relays.items()}
            val_bpb = _evaluate(root, case, shards) if case.train_tokens else None
        finally:
            for process in [*relays.values(), *shards]:
                process.stop()
        summaries = {name: json.loads((root / f"{name}.summary.json").read_text()) for name in learners}
    row = layout_row(net, case, layout, window, statuses, summaries)
    row["relays"] = {r: {k: h[k] for k in ("bytes_in", "bytes_out", "frames_in", "refused_in")} for r, h in carried.items()}
    return row | ({"val_bpb": val_bpb} if case.train_tokens else {})


def start_relays(net: Wan, layout: Layout, shards: list[LocalSyncer]) -> dict[str, LocalRelay]:
    """A relay in each region the layout gives one, in its namespace at its address (with its region's certificate)."""
    urls = [shard.url for shard in shards]
    relays: dict[str, LocalRelay] = {}
    for region in (r for r, on in layout.relay.items() if on):
        site = net.regions[region]
        relays[region] = LocalRelay(shards[0], region, urls, host=site.ip, prefix=site.command()).start()
    return relays


def _evaluate(root: Path, case: WanCase, shards: list[LocalSyncer]) -> float:
    """The trained model's val_bpb: the shards' final parts joined by a global checkpoint, evaluated here."""
    from ddctl.control.global_checkpoint import take
    from ddctl_agents.train.assembly import Assembly

    assembly = Assembly.build(case.job())
    result = take([s.url for s in shards], shards[0].connector(), root / "final", evaluate=assembly.evaluate)
    return round(float(result["val_bpb"]), 4)


COMMON = ("--snapshot-every", "3600", "--linger", "120")
"""Every synchronizer's flags: no snapshots in a run this short, and time after the job for its figures to be read."""


def shard_flags(shards: list[LocalSyncer], i: int, site: str) -> tuple[str, ...]:
    """Shard i's flags, at ``site``, to start it or, after ``kill``, to start it again on its own state directory."""
    return (*COMMON, "--shard-map", str(shards[0].job_dir / "shards.json"), "--shard", f"S{i}", "--state-dir",
            str(shards[i].root / "state"), "--site", site)  # fmt: skip


def start_shards(root: Path, net: Wan, case: WanCase, layout: Layout) -> list[LocalSyncer]:
    """One synchronizer process per shard, in its site's namespace; a single one is not sharded."""
    ips = [net.regions[site].ip for site in layout.shard_sites]
    sites = [net.regions[site] for site in layout.shard_sites]
    first = LocalSyncer(
        root / "S0", layout_job(case, layout), run=f"wan-{layout.name}", host=ips[0], also=ips, prefix=sites[0].command()
    )
    started = [first]
    for i in range(1, len(sites)):
        (root / f"S{i}").mkdir()
        (root / f"S{i}" / "job").symlink_to(first.job_dir)
        started.append(LocalSyncer(root / f"S{i}", host=ips[i], prefix=sites[i].command()))
    try:
        if len(started) == 1 and not case.train_tokens:  # trained: one shard, so the result is read like the others'
            first.start(*COMMON, "--eval-every", "3600", "--site", layout.shard_sites[0])
            return started
        (first.job_dir / "shards.json").write_text(json.dumps(shardmap.from_assignment(layout.owner).to_json()))
        for i, shard in enumerate(started):
            shard.start(*shard_flags(started, i, layout.shard_sites[i]))
    except BaseException:
        for shard in started:
            shard.kill()
        raise
    return started


def start_learners(
    root: Path,
    net: Wan,
    case: WanCase,
    layout: Layout,
    shards: list[LocalSyncer],
    together: bool = False,
    relays: dict[str, LocalRelay] | None = None,
) -> dict[str, subprocess.Popen[bytes]]:
    """Every learner of ``case`` in its region's namespace. ``together``: each waits, registered and bootstrapped,
    until ``steady_window`` has seen them all ready, so they take their first steps together: on two loaded cores
    their imports alone spread their starts over 14 s, and a slow region's bootstrap takes seconds more; the steady
    window (every learner stepping) shrinks by as much."""
    urls = [arg for shard in shards for arg in ("--syncer", shard.url)]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for name, region in case.learner_regions.items():
        argv = [sys.executable, "-m", "ddctl_agents.agent", *urls, "--name", name, "--token", shards[0].token(name)]
        argv += ["--ca", str(shards[0].ca), "--summary", str(root / f"{name}.summary.json"), "--region", region]
        argv += ["--synthetic-step", str(case.step_s)] if not case.train_tokens else []
        argv += ["--cadence", str(layout.cadence[region])]
        argv += ["--parallel-uploads", in_flight_text(layout.in_flight)]
        argv += ["--start-when", str(root / START_FILE)] if together else []
        if relay := (relays or {}).get(region):
            argv += ["--relay", relay.url, "--relay-token-file", str(relay.learner_token_file(name))]
        with (root / f"{name}.log").open("ab") as log:
            procs[name] = subprocess.Popen(net.regions[region].command(*argv), stdout=log, stderr=log, env=ENV)
    return procs


def steady_window(
    net: Wan,
    case: WanCase,
    shards: list[LocalSyncer],
    learners: dict[str, subprocess.Popen[bytes]],
    root: Path,
    together: bool = False,
) -> dict[str, Any]:
    """The links' counters over the steady part of the run: from the moment every learner has stepped to the moment
    the first one is 90% through its steps (bootstraps, final flushes and drains left out); then every learner's exit.
    The status polls cross the first shard's link too, once a second (about 1% of a 10 Mbit/s link)."""
    client = shards[0].client()
    try:

        def steps() -> list[int]:
            _exited_or_raise(learners, root)
            try:
                rows = client.status()["learners"]
            except Unavailable:
                return []
            return [int(r["step"]) for r in rows] if len(rows) == len(learners) else []

        if together:
            go = root / START_FILE

            def ready() -> bool:
                _exited_or_raise(learners, root)
                return all(ready_file(go, name).exists() for name in learners)

            wait_until(ready, timeout_s=300, every_s=0.2, what="every learner to be ready")
            go.touch()
        wait_until(lambda: min(steps() or [0]) >= 1, timeout_s=300, every_s=0.2, what="every learner to take its first step")
        start, began = net.sent(), time.monotonic()
        wait_until(lambda: max(steps() or [0]) >= 0.9 * case.steps or all(p.poll() is not None for p in learners.values()),
                   timeout_s=7200 if case.train_tokens else case.seconds * 20, every_s=1.0,
                   what="a learner 90% through its steps")  # fmt: skip
        end, seconds = net.sent(), time.monotonic() - began
    finally:
        client.close()
    for name, proc in learners.items():
        if proc.wait(timeout=1800) != 0:
            raise _failed(name, proc, root)
    moved = {r: (end[r][0] - start[r][0], end[r][1] - start[r][1]) for r in start}
    return {"seconds": seconds, "bytes": moved}


def _exited_or_raise(learners: dict[str, subprocess.Popen[bytes]], root: Path) -> None:
    for name, proc in learners.items():
        if proc.poll() is not None and proc.returncode != 0:
            raise _failed(name, proc, root)


def _failed(name: str, proc: subprocess.Popen[bytes], root: Path) -> DdctlError:
    return DdctlError(f"learner {name} exited {proc.returncode}: {(root / f'{name}.log').read_text()[-2000:]}")


def finished_status(shard: LocalSyncer) -> dict[str, Any]:
    """A shard's status once its job has finished (every learner's last updates merged). A status call that fails on the
    emulated WAN is asked again: under load a shaped link can lose an address lookup (CI: No route to host)."""
    client: SyncerClient = shard.client()
    try:
        ended = wait_until(
            lambda: (s := client.status())["job"]["phase"] == "finished" and s,
            timeout_s=180, what="a shard's end", every_s=0.5, retry_on=(Unavailable,),
        )  # fmt: skip
        return dict(ended)
    finally:
        client.close()


def layout_row(
    net: Wan,
    case: WanCase,
    layout: Layout,
    window: dict[str, Any],
    statuses: list[dict[str, Any]],
    summaries: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    job = summarize([(f"S{i}", s, "") for i, s in enumerate(statuses)])["job"]
    ledger, trained = job["ledger"], sum(int(s["trained_tokens"]) for s in summaries.values())
    predicted = {x.site: x.utilisation for x in layout.loads}
    pace, regions = _pace(case, summaries), _regions(case, summaries)
    waits = {r: v["round_trip_p50_s"] for r, v in regions.items() if v["round_trip_p50_s"] is not None}
    at_measured = {x.site: x.utilisation for x in predict(layout, at_pace(case.sites(), pace, waits), traffic(case.job()))}
    return {
        "layout": layout.name,
        "shards": [
            {"site": site, "fragments": [p for p, o in enumerate(layout.owner) if o == i]}
            for i, site in enumerate(layout.shard_sites)
        ],  # fmt: skip
        "cadence": layout.cadence,
        "in_flight": "auto" if layout.in_flight is None else layout.in_flight,
        "late_weight": layout.late_weight,
        "efficiency": round((ledger["merged"] + ledger["late_merged"]) / trained, 4) if trained else 0.0,
        "fresh": round(ledger["merged"] / trained, 4) if trained else 0.0,
        "regions": regions,
        "sites": {r: _site(net.regions[r], window, predicted[r], at_measured[r]) for r in case.links},
        "site_meters": {
            site: _site_meter(status, site, case.links[site][0])
            for site, status in zip(layout.shard_sites, statuses, strict=True)
        },
        "step_s": pace,
        "predicted_worst": round(layout.predicted, 4),
        "window_s": round(window["seconds"], 2),
        "trained_tokens": trained,
        "rounds": int(job["rounds"]),
        "ledger": ledger,
        "balanced": bool(job["balanced"]),
    }


def _site_meter(status: dict[str, Any], site: str, shaped_mbps: float) -> dict[str, Any]:
    """A shard's own reading of its site's link (``core/sitemeter.py``) against the link as shaped, and beside it what
    its crossings with each region read, [up, down]: the best one learner's transfers read (a share of a shared link),
    and all the region's learners' at once."""
    own = status.get("site", {})
    kinds = {"one": "", "together": "together_"}
    crossings = {
        r["name"]: {kind: [r.get(f"{prefix}{d}_mbps") for d in ("up", "down")] for kind, prefix in kinds.items()}
        for r in status.get("regions", [])
        if r["name"] != site
    }
    return {"up_mbps": own.get("up_mbps"), "down_mbps": own.get("down_mbps"), "shaped_mbps": shaped_mbps, "regions": crossings}


def _regions(case: WanCase, summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each region's learners: the share of what they trained that a shard accepted, and their bytes."""
    out: dict[str, dict[str, Any]] = {}
    regions = case.learner_regions
    for region in case.links:
        mine = [s for name, s in summaries.items() if regions[name] == region]
        trained = sum(int(s["trained_tokens"]) for s in mine)
        accepted = sum(int(s["acked_tokens"].get(k, 0)) for s in mine for k in ACCEPTED)
        out[region] = {
            "learners": len(mine),
            "accepted": round(accepted / trained, 4) if trained else None,
            "bytes_up": sum(int(s["bytes_up"]) for s in mine),
            "bytes_down": sum(int(s["bytes_down"]) for s in mine),
            **_round_trips([s["round_trip"] for s in mine]),
        }
    return out


def _round_trips(trips: list[dict[str, Any]]) -> dict[str, float | None]:
    """A region's send-to-adoption waits (``agent/roundtrip.py``): its learners' median p50 and their worst p95."""
    p50s = [t["p50_s"] for t in trips if t["p50_s"] is not None]
    p95s = [t["p95_s"] for t in trips if t["p95_s"] is not None]
    return {"round_trip_p50_s": statistics.median(p50s) if p50s else None, "round_trip_p95_s": max(p95s, default=None)}


def _pace(case: WanCase, summaries: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each region's measured step time: its learners' training seconds over their steps (a loaded machine is slower
    than ``case.step_s``, and moves fewer bytes a second than the plan assumed)."""
    out: dict[str, float] = {}
    regions = case.learner_regions
    for region in case.links:
        mine = [s for name, s in summaries.items() if regions[name] == region]
        steps = sum(int(s["step"]) - int(s["start_step"]) for s in mine)
        if steps > 0:
            out[region] = round(sum(float(s["train_seconds"]) for s in mine) / steps, 4)
    return out


def _site(region: WanRegion, window: dict[str, Any], predicted: float, at_measured: float) -> dict[str, Any]:
    """The site's busier direction against its link: measured over the window; predicted from the plan's priors (the
    declared step time, no wait) and from what the learners measured (their step time and send-to-adoption wait)."""
    up, down = window["bytes"][region.name]
    seconds = max(window["seconds"], 1e-9)
    measured = max(up * 8 / seconds / 1e6 / region.up_mbit, down * 8 / seconds / 1e6 / region.down_mbit)
    return {"measured": round(measured, 4), "predicted": round(predicted, 4), "predicted_at_pace": round(at_measured, 4),
            "bytes_up": up, "bytes_down": down}  # fmt: skip


__all__ = ["measure_wan"]

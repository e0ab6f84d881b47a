"""``ddctl bench replan``: the running re-planner over the emulated WAN, with a link halved and with links jittered.

Re-placing fragments pays where a shard's site carries mostly other regions'
traffic; a site whose own learners fill its link gains nothing from moving its
fragments away (its learners' cadence, fixed for their life, is what would help).
The issue's five regions are that second kind: there, halving a shard site's link
predicts no gain from any move (measured with the link model, ``docs/benchmarks.md``).
So the case here is a job whose two shards run in two synchronizer-only *hub*
regions: learners in a and b (two each, fast links) and c (one, a fifth of the
rate), hubs h1 and h2 (fast links, no learners). The plan splits the fragments
between the hubs.

Each scenario is a fresh job: shards, learners (``--synthetic-step``) and the
re-planner (``control/replanning.py``, looking every ``every_s`` from this machine over
the management link) run while the links change:

- ``halve``: h1's link is halved both ways a third of the way through; the target is
  one re-plan, moving fragments from h1 to h2, and none after it;
- ``noise``: every region's link is set to its rate times a factor drawn uniformly
  from [0.8, 1.2] every ``noise_every_s`` (seeded); the target is no re-plan;
- ``kill``: as ``halve``, and the shard the first move hands a fragment to is killed
  (``kill -9``) just before it takes the fragment in, then started again on its state
  directory after ``DOWN_S``; the target is the move finished by a later look (the
  old owner's log holds the hand-out), every ledger balanced and every acknowledged
  update in one shard's books.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddctl.bench.wan import finished_status, layout_row, shard_flags, start_learners, start_shards, steady_window
from ddctl.bench.wan_layouts import Layout, WanCase, predict
from ddctl.bench.wannet import Wan, reshape, wan
from ddctl.config.synchronizer import traffic
from ddctl.control.replanning import Replanning, watch
from ddctl.errors import DdctlError
from ddctl.local.service import LocalSyncer
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.core.replan import Replanner, ReplanSettings
from ddctl_agents.core.shardplan import PlanSettings, plan_shards

SCENARIOS = ("halve", "noise", "kill")
HUB_REGIONS = (("a", 1.0, 2), ("b", 1.0, 2), ("c", 0.2, 1), ("h1", 1.0, 0), ("h2", 1.0, 0))
HUBS = ("h1", "h2")
NOISE = 0.2
DOWN_S = 3.0
"""How long the killed shard stays down."""
BENCH_REPLAN = ReplanSettings(dwell_s=30.0)
"""The product's gain and confirmations; a dwell of 30 s, not 300, to fit a two-minute run."""

ONE_IN_FLIGHT = 1
"""Uploads in flight per learner, fixed: a re-plan is judged from the links' meters, not the learners' pacing."""


def hub_case(seconds: float = 120.0, fast_mbit: float = 60.0, inner_steps: int = 16, step_s: float = 0.1) -> WanCase:
    """The tiny preset in 6 fragments: an update of one fragment (93 KB in int4) and a version (348 KB in bf16) are
    both large enough for the links' measurement to read (``core/links.py``: 64 KiB and up)."""
    return WanCase(regions=HUB_REGIONS, preset="tiny", fragments=6, fast_mbit=fast_mbit, seconds=seconds,
                   inner_steps=inner_steps, step_s=step_s)  # fmt: skip


def hub_layout(case: WanCase) -> Layout:
    """The scheduler's plan with the hubs as the only shard sites, learners paced at its cadences."""
    sites = [replace(s, candidate=s.name in HUBS) for s in case.sites()]
    plan = plan_shards(sites, traffic(case.job()), PlanSettings(shards=len(HUBS), relays=False))
    made = Layout(name="hubs", shard_sites=tuple(s.site for s in plan.shards), owner=plan.owner, cadence=dict(plan.cadence),
                  relay=dict(plan.relay), in_flight=ONE_IN_FLIGHT, loads=())  # fmt: skip
    return replace(made, loads=predict(made, case.sites(), traffic(case.job())))


Changes = list[tuple[float, dict[str, tuple[float, float]]]]
"""(seconds after the learners start, region -> its new (up, down) Mbit/s), in time order."""


def changes(scenario: str, case: WanCase, noise_every_s: float, seed: int = 0) -> Changes:
    """What ``scenario`` does to the links."""
    if scenario in ("halve", "kill"):
        up, down = case.links["h1"]
        return [(case.seconds / 3, {"h1": (up / 2, down / 2)})]
    if scenario == "noise":
        rng, out, t = random.Random(seed), [], noise_every_s
        while t < case.seconds:
            jittered = {r: (up * rng.uniform(1 - NOISE, 1 + NOISE), down * rng.uniform(1 - NOISE, 1 + NOISE))
                        for r, (up, down) in case.links.items()}  # fmt: skip
            out.append((t, jittered))
            t += noise_every_s
        return out
    raise DdctlError(f"scenarios must be some of {', '.join(SCENARIOS)}, got {scenario!r}")


def measure_replan(
    case: WanCase,
    scenarios: Sequence[str] = SCENARIOS,
    settings: ReplanSettings = BENCH_REPLAN,
    every_s: float = 2.0,
    noise_every_s: float = 5.0,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Each scenario a fresh job over one emulated WAN; per scenario the link changes, every re-plan and the books."""
    if not scenarios:
        raise DdctlError(f"give at least one scenario of {', '.join(SCENARIOS)}")
    for name in scenarios:
        changes(name, case, noise_every_s)  # refuse an unknown scenario before any namespace is made
    layout = hub_layout(case)
    rows = []
    with wan(f"ddrep{os.getpid() % 100000}", case.links) as net:
        for name in scenarios:
            say(f"scenario {name}: {case.seconds:g} s of training, the re-planner looking every {every_s:g} s")
            rows.append(_run_scenario(net, case, layout, name, settings, every_s, noise_every_s))
            say(f"scenario {name}: {len(rows[-1]['replans'])} re-plan(s), books balanced: {rows[-1]['balanced']}")
    return {
        "case": {
            "links_mbit": case.links,
            "learners": case.learners,
            "preset": case.preset,
            "fragments": case.fragments,
            "inner_steps": case.inner_steps,
            "step_s": case.step_s,
            "seconds": case.seconds,
        },  # fmt: skip
        "replan": {
            "gain": settings.gain,
            "confirmations": settings.confirmations,
            "dwell_s": settings.dwell_s,
            "max_moves": settings.max_moves,
            "min_utilisation": settings.min_utilisation,
            "every_s": every_s,
        },  # fmt: skip
        "plan": {"shards": list(layout.shard_sites), "owner": list(layout.owner), "cadence": layout.cadence},
        "rows": rows,
    }


def _run_scenario(net: Wan, case: WanCase, layout: Layout, scenario: str, settings: ReplanSettings, every_s: float,
                  noise_every_s: float) -> dict[str, Any]:  # fmt: skip
    events: list[dict[str, Any]] = []
    applied: list[dict[str, Any]] = []
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="ddctl-replan-") as tmp:
        root = Path(tmp)
        shards = start_shards(root, net, case, layout)
        saboteur = Saboteur(shards, layout.shard_sites, armed=scenario == "kill")
        try:
            loop = Replanning(urls=[s.url for s in shards], connect=saboteur.connect,
                              sites_of_shards={f"S{i}": site for i, site in enumerate(layout.shard_sites)},
                              priors=case.sites(), traffic=traffic(case.job()), relays=False,
                              planner=Replanner(settings))  # fmt: skip
            learners = start_learners(root, net, case, layout, shards)
            started = time.monotonic()
            threads = [
                threading.Thread(target=watch, args=(loop, every_s, stop.is_set, events.append), daemon=True),
                threading.Thread(
                    target=_change_links, args=(net, changes(scenario, case, noise_every_s), started, stop, applied), daemon=True
                ),  # fmt: skip
            ]
            for thread in threads:
                thread.start()
            try:
                window = steady_window(net, case, shards, learners, root)
            finally:
                stop.set()
                for proc in learners.values():
                    if proc.poll() is None:
                        proc.kill()
                for thread in threads:
                    thread.join(timeout=60)
            statuses = [finished_status(s) for s in shards]
        finally:
            for shard in shards:
                shard.stop()
        summaries = {name: json.loads((root / f"{name}.summary.json").read_text()) for name in learners}
    row = layout_row(net, case, layout, window, statuses, summaries)
    acked = sum(sum(s["acked_tokens"].values()) - s["acked_tokens"].get("duplicate", 0) for s in summaries.values())
    return _scenario_row(scenario, row, events, applied, started, statuses, settings.gain) | {
        "killed": [{**k, "t": round(k["t"] - started, 2)} for k in saboteur.fired],
        "acked_tokens": acked,  # every update a learner saw acknowledged (a duplicate's first copy counts once)
    }


@dataclass
class Saboteur:
    """The re-planner's clients; when ``armed``, the first ``hand_in`` kills its shard (``kill -9``) first and starts
    it again ``DOWN_S`` later on its own state directory, so the handoff breaks between its two halves."""

    shards: list[LocalSyncer]
    sites: tuple[str, ...]
    """Where each shard runs (its ``--site``)."""
    armed: bool
    fired: list[dict[str, Any]] = field(default_factory=list)

    def connect(self, url: str) -> SyncerClient:
        saboteur = self

        class Client(SyncerClient):
            def hand_in(self, data: bytes) -> dict[str, Any]:
                saboteur.strike(self.url)
                return super().hand_in(data)

        return self.shards[0].connector(Client)(url)

    def strike(self, url: str) -> None:
        if not self.armed or self.fired:
            return
        i = [s.url for s in self.shards].index(url)
        self.shards[i].kill()
        self.fired.append({"shard": f"S{i}", "t": time.monotonic()})
        threading.Timer(DOWN_S, self._restart, args=(i,)).start()

    def _restart(self, i: int) -> None:
        try:
            self.shards[i].start(*shard_flags(self.shards, i, self.sites[i]))
            self.fired[-1]["restarted_after_s"] = round(time.monotonic() - self.fired[-1]["t"], 2)
        except Exception as exc:  # noqa: BLE001 (reported in the row: the books will show what it cost)
            self.fired[-1]["restart_error"] = str(exc)[:300]


def _change_links(net: Wan, planned: Changes, started: float,
                  stop: threading.Event, applied: list[dict[str, Any]]) -> None:  # fmt: skip
    for at, rates in planned:
        if stop.wait(max(0.0, started + at - time.monotonic())):
            return
        for region, (up, down) in rates.items():
            reshape(net, region, up, down)
        applied.append(
            {"t": round(time.monotonic() - started, 2), "mbit": {r: [round(u, 3), round(d, 3)] for r, (u, d) in rates.items()}}
        )


def _scenario_row(scenario: str, row: dict[str, Any], events: list[dict[str, Any]], applied: list[dict[str, Any]],
                  started: float, statuses: list[dict[str, Any]], gain: float) -> dict[str, Any]:  # fmt: skip
    replans = [{"t": round(e["t"] - started, 2), **e["replan"]} for e in events if e.get("replan") is not None]
    looks = [e for e in events if "error" not in e and "skipped" not in e]
    return {
        "scenario": scenario,
        "changes": applied,
        "looks": len(looks),
        "last_look_t": round(max(e["t"] for e in events) - started, 2) if events else None,
        "failed_looks": [e["error"] for e in events if "error" in e][:5],
        "replans": replans,
        "looks_past_the_gain": sum(
            1 for e in looks if e.get("utilisation") and e.get("best") and 1 - e["best"] / e["utilisation"] >= gain
        ),  # fmt: skip
        "longest_streak": max((e.get("streak", 0) for e in looks), default=0),
        "peak_gain_seen": max(
            (1 - e["best"] / e["utilisation"] for e in looks if e.get("utilisation") and e.get("best")), default=None
        ),  # fmt: skip
        "measured_last": looks[-1]["sites"] if looks else None,
        "gain_by_look": [  # [t, predicted gain, streak]: how the decision built up
            [round(e["t"] - started, 1), round(1 - e["best"] / e["utilisation"], 3), e.get("streak", 0)]
            for e in looks
            if e.get("utilisation") and e.get("best") is not None
        ],
        "site_meters": row["site_meters"],
        "owned_at_end": [s["shard"]["owned"] for s in statuses],
        "finished_by_a_later_look": sorted({p for e in events for p in e.get("finished", [])}),
        "received_tokens": row["ledger"]["received"],
        "efficiency": row["efficiency"],
        "balanced": row["balanced"],
        "ledger": row["ledger"],
        "rounds": row["rounds"],
        "window_s": row["window_s"],
    }


__all__ = ["HUB_REGIONS", "SCENARIOS", "changes", "hub_case", "hub_layout", "measure_replan"]

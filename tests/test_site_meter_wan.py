"""The site meter against the truth: a shard behind a shaped link, four learners fetching every version at once.

Each learner's transfers get a share of the shard's link while they overlap, so
what one learner reads is anywhere from a share to the link (when it happened to
be alone); the shard's reading of its own site must read the link, as tc shaped it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ddctl.bench.wan import _run_layout
from ddctl.bench.wan_layouts import Layout, WanCase, predict
from ddctl.bench.wannet import wan
from ddctl.config.synchronizer import traffic
from tests.test_bench_wan import NEEDS_ROOT

SITE_MBIT = 16.0


@pytest.mark.slow
@NEEDS_ROOT
def test_a_shard_reads_its_own_shaped_link_where_each_learner_reads_a_share() -> None:
    case = WanCase(fast_mbit=64.0, step_s=0.05, seconds=20.0, preset="tiny", inner_steps=8,
                   regions=(("h", SITE_MBIT / 64.0, 0), ("a", 1.0, 4)))  # fmt: skip
    made = Layout(name="one", shard_sites=("h",), owner=(0,) * case.fragments, cadence={"h": 1, "a": 1},
                  relay={"h": False, "a": False}, in_flight=1, loads=())  # fmt: skip
    layout = replace(made, loads=predict(made, case.sites(), traffic(case.job())))
    with wan("ddsite", case.links) as net:
        row = _run_layout(net, case, layout)
    own = row["site_meters"]["h"]
    tc = {d: round(row["sites"]["h"][f"bytes_{d}"] * 8 / row["window_s"] / 1e6, 2) for d in ("up", "down")}
    print(json.dumps({"site_meter": own, "tc_mbps": tc}))  # the figures of docs/benchmarks.md (pytest -s)
    assert own["shaped_mbps"] == SITE_MBIT
    # versions out to four learners at once, and their updates in: the link, read as a lower bound (CI read out as low
    # as 74% of it once; 97% and 94% in other runs), never the share one learner gets of it (25%)
    assert 0.6 * SITE_MBIT <= own["up_mbps"] <= 1.15 * SITE_MBIT
    assert 0.6 * SITE_MBIT <= own["down_mbps"] <= 1.15 * SITE_MBIT
    together_up, together_down = own["regions"]["a"]["together"]  # region a's side: all four at once, the same link
    assert together_down == pytest.approx(own["up_mbps"], rel=0.15) and together_up == pytest.approx(own["down_mbps"], rel=0.15)
    assert row["balanced"] and row["regions"]["a"]["learners"] == 4

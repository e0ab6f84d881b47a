"""A service's own site link on its status page and in its metrics: every transfer across the site, none inside it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddctl_agents.core.sitemeter import SETTLE_S
from ddctl_agents.service.metrics import metrics
from ddctl_agents.service.observability import status
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.train.assembly import Assembly
from tests.builders import small_run


def test_the_site_reads_what_crossed_it_together_and_leaves_its_own_learners_out(tmp_path: Path) -> None:
    now = [1000.25]
    assembly = Assembly.build(small_run(learners=4))

    async def scenario() -> tuple[dict, str]:
        rt = SyncerRuntime(assembly, ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600, site="h"), clock=lambda: now[0])
        await rt.start()
        for name, region in (("L0", "a"), ("L1", "b"), ("L2", "h"), ("L3", "b")):
            await rt.register(name, 1, region)
        for _ in range(4):  # each second: L0 and L1 each get 1 MB out in the same 0.5 s; L2, inside the site, 50 MB
            now[0] += 1.0
            rt.observe_link("L0", "down", 1_000_000, 0.5, kernel=True)
            rt.observe_link("L1", "down", 1_000_000, 0.5, kernel=True)
            rt.observe_link("L2", "down", 50_000_000, 0.5, kernel=True)
            rt.observe_link("L0", "up", 250_000, 0.5)
            rt.observe_link("L3", "down", 1_000_000, 0.5, kernel=True)  # b's two learners at once: b reads both
        now[0] += SETTLE_S + 1.0
        page, text = await rt.view(status), await rt.view(metrics)
        await rt.stop()
        return page, text

    page, text = asyncio.run(scenario())
    site = page["site"]
    assert site["name"] == "h"
    assert site["up_mbps"] == pytest.approx(3_000_000 / 0.5 * 8 / 1e6)  # 48: three learners' shares together
    assert site["down_mbps"] == pytest.approx(250_000 / 0.5 * 8 / 1e6)  # 4: L0's uploads in
    rows = {r["name"]: r for r in page["regions"]}
    assert rows["a"]["down_mbps"] == pytest.approx(16.0)  # one learner alone reads its share
    assert rows["a"]["together_down_mbps"] == pytest.approx(16.0) and rows["a"]["together_up_mbps"] == pytest.approx(4.0)
    assert "together_down_mbps" not in rows["h"]  # inside the site: no link crossed
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {s.labels["direction"]: s.value for s in families["ddctl_site_bytes_per_second"].samples}
    assert samples == {"up": pytest.approx(6e6), "down": pytest.approx(5e5)}
    assert rows["b"]["down_mbps"] == pytest.approx(16.0) and rows["b"]["together_down_mbps"] == pytest.approx(32.0)
    assert {s.labels["site"] for s in families["ddctl_site_bytes_per_second"].samples} == {"h"}


def test_windows_read_late_are_placed_where_they_ended_and_pooled_samples_stay_off_the_sites_clock(tmp_path: Path) -> None:
    """L0's and L1's versions crossed together, 1 MB each in the same 0.5 s; a stream reads its counters only before
    its next record, so L0's window is read 3 s after it ended and L1's 0.25 s after. Laid where each was read, they
    would meet in no bin and read the site as one share; laid where each ended, they read both shares at once."""
    now = [1000.25]
    assembly = Assembly.build(small_run(learners=2))

    async def scenario() -> tuple[dict, dict]:
        rt = SyncerRuntime(assembly, ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600, site="h"), clock=lambda: now[0])
        await rt.start()
        for name, region in (("L0", "a"), ("L1", "b")):
            await rt.register(name, 1, region)
        now[0] = 1001.0  # both ended at 1000.75
        rt.observe_link("L1", "down", 1_000_000, 0.5, kernel=True, rate=False, ended_ago=0.25)
        now[0] = 1003.75
        rt.observe_link("L0", "down", 1_000_000, 0.5, kernel=True, rate=False, ended_ago=3.0)
        rt.observe_link("L1", "down", 6_000_000, 0.5, kernel=True, site=False)  # a pooled sample: L1's rate only
        now[0] = 1005.0 + SETTLE_S
        page = await rt.view(status)
        now[0] += 10.0
        later = await rt.view(status)
        await rt.stop()
        return page, later

    page, later = asyncio.run(scenario())
    assert page["site"]["up_mbps"] == pytest.approx(2_000_000 / 0.5 * 8 / 1e6)  # 32: both shares, not 16
    assert later["site"]["up_mbps"] == page["site"]["up_mbps"]  # and nothing else reached the site's clock
    rows = {r["name"]: r for r in page["regions"]}
    assert rows["b"]["down_mbps"] == pytest.approx(96.0) and rows.get("a", {}).get("down_mbps") is None  # pooled only

"""No exception ends a loop of the service silently, and what the service shows can always be serialised."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddctl_agents.core import version_delta
from ddctl_agents.service import supervise as supervision
from ddctl_agents.service.metrics import metrics
from ddctl_agents.service.observability import health, status
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.train.assembly import Assembly
from tests.builders import small_run
from tests.test_service_recovery import frame_for, settle


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(small_run(learners=2))


def test_a_round_loop_that_raises_is_logged_restarted_and_merges_on(
    tmp_path: Path, assembly: Assembly, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(supervision, "RESTART_FIRST_S", 0.01)

    async def scenario() -> tuple[dict[str, int], list[str], int]:
        rt = SyncerRuntime(assembly, ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600))
        await rt.start()
        real_poll, calls = rt._poll, [0]

        def flaky_poll():  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("a bug in the round loop")
            return real_poll()

        monkeypatch.setattr(rt, "_poll", flaky_poll)
        await rt.register("L0", 1, "r")
        await rt.push("L0", frame_for(rt, "L0", 0, 0.01))
        await settle(rt, 1)
        failures, events, rounds = dict(rt.task_failures), [e["event"] for e in rt.roster.events], rt.syncer.rounds_closed
        await rt.stop()
        return failures, events, rounds

    failures, events, rounds = asyncio.run(scenario())
    assert failures == {"rounds": 1} and "task-failed" in events and rounds >= 1
    assert any("task rounds failed" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_version_that_cannot_be_encoded_degrades_its_fragment_not_the_start(
    tmp_path: Path, assembly: Assembly, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_encode = version_delta.encode_fragment  # what the publisher's coder frames versions with

    def encode(message, codec, block):  # type: ignore[no-untyped-def]
        if message.fragment == 1 and message.version == 0:
            raise ValueError("cannot encode bf16: input contains NaN or Inf")
        return real_encode(message, codec, block)

    monkeypatch.setattr(version_delta, "encode_fragment", encode)

    async def scenario() -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
        rt = SyncerRuntime(assembly, ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600))
        await rt.start()  # before: the lifespan failed and the job could not come up
        hurt = await rt.view(health)
        await rt.register("L0", 1, "r")
        await rt.push("L0", frame_for(rt, "L0", 1, 0.01))
        await settle(rt, 1)
        for _ in range(200):  # the round closed; its version is published just after
            if rt.publisher.versions()[1] >= 1:
                break
            await asyncio.sleep(0.01)
        healed, page = await rt.view(health), await rt.view(status)
        await rt.stop()
        return hurt, healed, page

    hurt, healed, page = asyncio.run(scenario())
    assert hurt["state"] == "degraded" and hurt["degraded"][0]["fragment"] == 1  # type: ignore[index]
    assert "NaN or Inf" in hurt["degraded"][0]["reason"]  # type: ignore[index]
    assert healed["state"] == "healthy" and page["degraded"] == []  # version 1 was sent: the mark is gone


def test_status_and_metrics_never_carry_a_non_finite_number(tmp_path: Path, assembly: Assembly) -> None:
    async def scenario() -> tuple[str, str, dict[str, object]]:
        rt = SyncerRuntime(assembly, ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600))
        await rt.start()
        await rt.register("L0", 1, "r")
        links = rt.syncer.links["L0"]
        links.up.bytes_per_s, links.up.rtt_s, links.down.bytes_per_s = math.inf, math.nan, 1e308 * 10
        rt.roster.info["L0"].tokens_per_s = math.inf
        page = await rt.view(status)
        text, raw = await rt.view(metrics), json.dumps(page, allow_nan=False)
        await rt.stop()
        return raw, text, page

    raw, text, page = asyncio.run(scenario())
    learner = page["learners"][0]  # type: ignore[index]
    assert learner["up_mbps"] is None and learner["rtt_ms"] is None and learner["tokens_per_s"] is None
    assert "inf" not in text.lower() and "nan" not in text.lower() and "Infinity" not in raw
    families = {f.name: f for f in text_string_to_metric_families(text)}  # prometheus-client's own parser reads it
    assert families["ddctl_learners_live"].samples[0].value == 1.0
    assert families["ddctl_link_bytes_per_second"].samples == []  # both directions are inf here: left out
    assert families["ddctl_rounds"].type == "counter" and families["ddctl_rounds"].samples[0].name == "ddctl_rounds_total"


def test_a_link_sample_beyond_any_link_is_ignored() -> None:
    from ddctl_agents.core.links import LinkEstimate

    link = LinkEstimate()
    link.observe(1 << 62, 1e-300, rtt_s=1e308)
    assert link.bytes_per_s is None and link.rtt_s is None
    link.observe(1000, 0.001, rtt_s=0.02)
    assert link.bytes_per_s == pytest.approx(1e6) and link.rtt_s == pytest.approx(0.02)

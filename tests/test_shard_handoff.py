"""Moving a fragment between running shards: during training, and after a shard dies half way through a move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.dashboard.sharded import job_status
from ddctl.local.service import LocalSyncer
from ddctl_agents.agent.client import Refused
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.waiting import wait_until
from tests.service_harness import small_job
from tests.shard_harness import (
    FRAGMENTS,
    kill_left,
    longer_shards,
    replays_bit_for_bit,
    restart,
    shards,
    start_learner,
    status,
    update_frame,
    wait_finished,
    wait_learners,
)

__all__ = ["longer_shards", "shards"]  # fixtures
pytestmark = pytest.mark.slow
runner = CliRunner()


def move(shards: list[LocalSyncer], fragment: int, to: str) -> dict:
    urls = [a for s in shards for a in ("--syncer", s.url)]
    args = ["syncer", "move", str(shards[0].job_dir), *urls, "--fragment", str(fragment), "--to", to, "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_a_fragment_moves_to_another_shard_while_learners_train(tmp_path: Path, longer_shards: list[LocalSyncer]) -> None:
    shards = longer_shards
    learners = {name: start_learner(tmp_path, shards, name) for name in ("L0", "L1")}
    try:
        wait_until(lambda: status(shards[1])["versions"][1] >= 2, timeout_s=120, what="fragment 1 to merge on S1")
        moved = move(shards, 1, "S0")
        assert (moved["from"], moved["to"], moved["epoch"], moved["resumed"]) == ("S1", "S0", 2, False)
        again = move(shards, 1, "S0")  # nothing left to do
        assert again["moved"] is False and "owns fragment 1 already" in again["reason"]
        wait_learners(tmp_path, learners)
    finally:
        kill_left(learners)
    finals = wait_finished(shards)
    assert [f["shard"]["owned"] for f in finals] == [[0, 1, 2], [3]] and {f["shard"]["epoch"] for f in finals} == {2}
    frozen = finals[1]["versions"][1]
    assert frozen == moved["version"] and finals[0]["versions"][1] > frozen  # it went on merging at its new owner
    summaries = [json.loads((tmp_path / f"{name}.summary.json").read_text()) for name in learners]
    acked = sum(sum(s["acked_tokens"].values()) - s["acked_tokens"].get("duplicate", 0) for s in summaries)
    assert sum(f["ledger"]["received"] for f in finals) == acked  # every acknowledged token in one shard's books
    assert all(f["ledger"]["balanced"] and f["ledger"]["pending"] == 0 for f in finals)
    assert sum(s["rejected_tokens"] for s in summaries) == 0  # refused at the old owner, retried at the new one
    replays_bit_for_bit(shards)  # the move replayed too: S1 hands fragment 1 out, S0 takes in what S1 exports

    urls = [a for s in shards for a in ("--syncer", s.url)]
    shown = runner.invoke(app, ["syncer", "status", str(shards[0].job_dir), *urls, "--json"])
    assert shown.exit_code == 0, shown.output
    job = json.loads(shown.stdout)["job"]
    assert job["versions"] == [finals[0]["versions"][p] for p in (0, 1, 2)] + [finals[1]["versions"][3]]
    assert job["ledger"]["received"] == acked and job["balanced"] and job["epoch"] == 2 and not job["partial"]
    assert job["tokens"]["trained"] == max(f["tokens"]["trained"] for f in finals)
    table = runner.invoke(app, ["syncer", "status", str(shards[0].job_dir), *urls])
    assert table.exit_code == 0 and "S0" in table.output and "\x1b[" not in table.output  # plain when not a terminal
    shards[1].kill()
    partial = runner.invoke(app, ["syncer", "status", str(shards[0].job_dir), *urls, "--json"])
    partly = json.loads(partial.stdout)["job"]
    assert partial.exit_code == 6 and partly["partial"] is True
    assert partly["unheard"] == [3] and partly["versions"] == [finals[0]["versions"][p] for p in (0, 1, 2)] + [None]
    table = runner.invoke(app, ["syncer", "status", str(shards[0].job_dir), *urls])
    assert table.exit_code == 6 and "unknown: 3" in table.output and "unreachable" in table.output


def test_a_move_broken_by_kill_9_is_finished_by_running_it_again(shards: list[LocalSyncer]) -> None:
    assembly = Assembly.build(small_job(learners=2, tokens=120_000, fragments=FRAGMENTS, inner_steps=8))
    learner = shards[1].client("L0")
    try:
        learner.register("L0", 1, "region-L0")
        frame = update_frame(assembly, 3, 1)
        assert learner.push(frame, 3)["status"] == "accepted"  # an open round on S1, acknowledged
    finally:
        learner.close()
    admin = shards[1].client()
    try:
        export = admin.hand_out(3, "S0", 2)  # S1 closes the round and logs the handoff; S0 never hears of it
        assert admin.hand_out(3, "S0", 2) == export  # asked again: the same export, from the frozen fragment
        with pytest.raises(Refused, match="is not past this shard's 2"):
            admin.hand_out(1, "S0", 2)
    finally:
        admin.close()
    shards[1].kill()
    restart(shards[1], "S1")
    recovered = status(shards[1])
    admin = shards[1].client()
    try:
        assert 'ddctl_handoffs_total{direction="out",shard="S1"} 1.0' in admin.metrics()  # replayed from its log
    finally:
        admin.close()
    assert recovered["shard"]["epoch"] == 2 and recovered["shard"]["owned"] == [1]  # the log replayed the handoff
    assert recovered["versions"][3] == 1 and recovered["ledger"]["merged"] == 8192
    before = status(shards[0])  # S0 has not taken fragment 3 in: owned by neither, its newest version (1) at S1
    both = job_status([("a", before, ""), ("b", recovered, "")])
    assert both is not None and both["versions"][3] == 1 and before["versions"][3] == 0
    urls = [a for s in shards for a in ("--syncer", s.url)]
    shown = runner.invoke(app, ["syncer", "status", str(shards[0].job_dir), *urls, "--json"])
    assert shown.exit_code == 0, shown.output
    mid = json.loads(shown.stdout)["job"]  # syncer status says the same, and why: in the middle of a handoff
    assert mid["versions"] == both["versions"] and mid["handoff"] == [3] and mid["unheard"] == []
    table = runner.invoke(app, ["syncer", "status", str(shards[0].job_dir), *urls])
    assert table.exit_code == 0 and "handing off: 3" in table.output and "unknown" not in table.output
    alone = job_status([("a", before, ""), ("b", None, "connection refused")])  # S0's map: S1 owns 1 and 3
    assert alone is not None and alone["versions"] == [before["versions"][0], None, before["versions"][2], None]

    learner = shards[1].client("L0")
    try:
        with pytest.raises(Refused, match="shard S1 does not own fragment 3 at shard map epoch 2: shard S0 does"):
            learner.push(frame, 3)
    finally:
        learner.close()
    finished = move(shards, 3, "S0")  # S0's own map still names S1: it asks S1 again and takes the export in
    assert (finished["from"], finished["resumed"], finished["epoch"], finished["version"]) == ("S1", True, 2, 1)
    s0 = status(shards[0])
    assert s0["shard"]["owned"] == [0, 2, 3] and s0["versions"][3] == 1
    learner = shards[0].client("L0")
    try:
        learner.register("L0", 1, "region-L0")
        assert learner.push(frame, 3)["status"] == "duplicate"  # its acknowledgement was lost: applied once, at S1
        assert learner.shards()["map"]["epoch"] == 2
    finally:
        learner.close()
    admin = shards[0].client()
    try:
        assert admin.hand_in(export)["installed"] is False  # installed once
        scraped = admin.metrics()
        assert 'ddctl_handoffs_total{direction="in",shard="S0"} 1.0' in scraped
        assert 'ddctl_shard_map_epoch{shard="S0"} 2.0' in scraped and 'ddctl_fragments_owned{shard="S0"} 3.0' in scraped
        with pytest.raises(Refused, match="not a readable|frame|magic|bad"):
            admin.hand_in(b"not a frame")
    finally:
        admin.close()


hostile = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20),
    st.sampled_from(["S1", "S0", "S9", "L0", "S1\n", "²", 2**63, -1, 0, 1, 2, 4096]),
)  # fmt: skip


def test_hostile_admin_requests_to_a_shard_are_refused_never_a_500(shards: list[LocalSyncer]) -> None:
    admin = shards[0].client()
    other = shards[1].client()
    export = other.hand_out(1, "S0", 2)  # a real export, to mutate
    cases: list[tuple[str, bytes]] = []

    @settings(max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def case(data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["cut", "out", "in", "in-bytes"]))
        if kind == "cut":
            path, body = "/v1/admin/cut", json.dumps({"epoch": data.draw(hostile)}).encode()
        elif kind == "out":
            fields = {k: data.draw(hostile) for k in data.draw(st.sets(st.sampled_from(["fragment", "to", "epoch", "x"])))}
            path, body = "/v1/admin/handoff/out", json.dumps(fields).encode()
        elif kind == "in":
            at = data.draw(st.integers(0, len(export) - 1))
            path, body = (
                "/v1/admin/handoff/in",
                export[:at] + bytes([export[at] ^ data.draw(st.integers(1, 255))]) + export[at + 1 :],
            )
        else:
            path, body = "/v1/admin/handoff/in", data.draw(st.binary(max_size=200))
        answer = admin.http.post(f"{shards[0].url}{path}", content=body)
        cases.append((path, body[:80]))
        assert answer.status_code < 500, (path, body[:200], answer.text[:300])

    try:
        case()
        assert len(cases) == 150
        assert admin.hand_in(export)["installed"] is True  # the untouched export still installs: nothing was corrupted
        after = admin.status()
        assert after["degraded"] == [] and after["task_failures"] == {} and after["ledger"]["balanced"]
        assert str(after["rejections"].get("500", 0)) == "0"
    finally:
        admin.close()
        other.close()

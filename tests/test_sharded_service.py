"""A sharded synchronizer for real: two shard processes, learner processes routing by the map, HTTP/2 over TLS.

Each shard owns whole fragments; the learners send each fragment to its owner
and adopt versions from both. Nothing coordinates the shards, and the books of
the two together must account for every token the learners sent.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.local.service import LocalSyncer
from ddctl_agents.agent.client import Refused
from ddctl_agents.core import shardmap
from ddctl_agents.core.messages import decode_fragment
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.waiting import wait_until
from tests.service_harness import small_job
from tests.shard_harness import (
    FRAGMENTS,
    SHARDS,
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


def test_two_shards_train_one_model_and_their_books_add_up(tmp_path: Path, shards: list[LocalSyncer]) -> None:
    learners = {name: start_learner(tmp_path, shards, name) for name in ("L0", "L1")}
    try:
        wait_learners(tmp_path, learners)
    finally:
        kill_left(learners)
    finals = wait_finished(shards)
    the_map = shardmap.round_robin(SHARDS, FRAGMENTS)
    for i, final in enumerate(finals):
        owned = sorted(the_map.owned(f"S{i}"))
        assert final["shard"] == {"name": f"S{i}", "epoch": 1, "shards": ["S0", "S1"], "owned": owned,
                                  "owners": list(the_map.owners)}  # fmt: skip
        versions = final["versions"]
        assert all(versions[p] > 0 for p in owned), versions  # every owned fragment merged, here and only here
        assert all(versions[p] == 0 for p in range(FRAGMENTS) if p not in owned), versions
        assert set(final["clock"]) >= {"S0", "S1"} and final["clock"][f"S{i}"] > 0
        assert final["ledger"]["balanced"] and final["ledger"]["pending"] == 0
        assert sorted(final["finished"]) == ["L0", "L1"]
        summary = json.loads((shards[i].root / "state" / "summary.json").read_text())
        assert summary["shard"] == f"S{i}" and summary["val_bpb"] is None and summary["checkpoint"] is None
    summaries = [json.loads((tmp_path / f"{name}.summary.json").read_text()) for name in learners]
    acked = sum(sum(s["acked_tokens"].values()) for s in summaries)
    received = sum(f["ledger"]["received"] for f in finals)
    assert received == acked > 0  # every fragment-token a learner had acknowledged, by one shard or the other
    assert sum(s["rejected_tokens"] for s in summaries) == 0
    merged = sum(f["ledger"]["merged"] + f["ledger"]["late_merged"] for f in finals)
    assert merged == received - sum(f["ledger"]["dropped"] + f["ledger"]["rejected"] for f in finals)

    # the global model is the owners' fragments together, and it learned
    assembly = Assembly.build(small_job(learners=2, tokens=120_000, fragments=FRAGMENTS, inner_steps=8))
    params = dict(assembly.initial)
    for p in range(FRAGMENTS):
        client = shards[the_map.owners[p]].client()
        try:
            frame = client._request("GET", f"/v1/fragments/{p}").content
        finally:
            client.close()
        message, _ = decode_fragment(frame)
        assert message.version == finals[the_map.owners[p]]["versions"][p]
        params.update({name: tensor.float() for name, tensor in message.tensors.items()})
    initial_bpb, final_bpb = assembly.evaluate(dict(assembly.initial)), assembly.evaluate(params)
    assert final_bpb < initial_bpb - 0.3, (initial_bpb, final_bpb)
    replays_bit_for_bit(shards)


def test_a_shard_refuses_an_update_of_a_fragment_it_does_not_own(shards: list[LocalSyncer]) -> None:
    client = shards[0].client("L0")
    try:
        with pytest.raises(Refused, match="shard S0 does not own fragment 1 at shard map epoch 1: shard S1 does") as info:
            client.push(b"\0" * 64, 1)  # refused on its header, before the body is read or decoded
        assert (info.value.status, info.value.code) == (409, "not_owner")
        assert client.shards() == {"shard": "S0", "map": shardmap.round_robin(SHARDS, FRAGMENTS).to_json()}
    finally:
        client.close()
    raw = httpx.post(
        f"{shards[0].url}/v1/updates",
        content=b"\0" * 64,
        headers={"authorization": f"Bearer {shards[0].token('L0')}", "x-ddctl-fragment": "3"},
        verify=ssl.create_default_context(cafile=str(shards[0].ca)),
    )
    assert raw.status_code == 409 and raw.json()["owner"] == "S1" and raw.json()["epoch"] == 1
    assert status(shards[0])["rejections"] == {"409": 2}


def test_a_global_checkpoint_is_one_cut_across_shards_and_pulls_as_a_model(
    tmp_path: Path, longer_shards: list[LocalSyncer]
) -> None:
    shards = longer_shards
    learners = {name: start_learner(tmp_path, shards, name) for name in ("L0", "L1")}
    try:
        checkpoint_mid_run(tmp_path, shards, learners)
    finally:
        kill_left(learners)


def checkpoint_mid_run(tmp_path: Path, shards: list[LocalSyncer], learners: dict[str, subprocess.Popen[bytes]]) -> None:
    wait_until(lambda: all(status(s)["rounds"] >= 2 for s in shards), timeout_s=120, what="rounds on both shards")
    admin = shards[0].client()
    try:
        part = admin.cut(1)  # S0's marker only: S1 must cut on the first update coloured by S0's versions
    finally:
        admin.close()
    assert part["part"] == {"shard": "S0", "map_epoch": 1, "cut": 1, "fragments": [0, 2]}
    assert set(part["files"]) == {"model.safetensors", "outer.safetensors"} and part["val_bpb"] is None
    s1 = wait_until(lambda: (st := status(shards[1]))["clock"]["cut"] == 1 and st, timeout_s=60, what="S1 to cut by colour")
    cut_events = [e | {"t": 0} for e in s1["events"] if e["event"] == "cut"]
    assert cut_events == [{"event": "cut", "epoch": 1, "trigger": "update", "t": 0}]
    admin = shards[1].client()
    try:
        assert 'ddctl_checkpoint_cuts_total{shard="S1",trigger="update"} 1.0' in admin.metrics()
    finally:
        admin.close()
    tape = [json.loads(line) for line in (shards[1].root / "state" / "tape.jsonl").read_text().splitlines()]
    assert [r for r in tape if r["type"] == "cut"][0]["trigger"] == "update"

    out = tmp_path / "global"
    urls = [a for s in shards for a in ("--syncer", s.url)]
    result = runner.invoke(app, ["syncer", "checkpoint", str(shards[0].job_dir), *urls, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    taken = json.loads(result.stdout)
    assert taken["cut"] == 2 and taken["shards"] == ["S0", "S1"] and taken["path"] == str(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cut"] == 2 and manifest["part"] is None and manifest["val_bpb"] == taken["val_bpb"]
    assert all(v >= 1 for v in manifest["versions"]) and manifest["vclock"]["cut"] == 2
    for learner in learners.values():
        assert learner.wait(timeout=300) == 0

    pulled = tmp_path / "model"
    result = runner.invoke(app, ["pull", "--from", str(out), "--out", str(pulled), "--json"])
    assert result.exit_code == 0, result.output
    assembly = Assembly.build(small_job(learners=2, tokens=300_000, fragments=FRAGMENTS, inner_steps=8))
    params = load_file(str(pulled / "model.safetensors"))
    assert set(params) == set(assembly.initial)
    assert assembly.evaluate(params) == taken["val_bpb"] < assembly.evaluate(dict(assembly.initial)) - 0.2

    part_only = shards[0].root / "state" / "cuts" / "cut-000002"
    refused = runner.invoke(app, ["pull", "--from", str(part_only), "--out", str(tmp_path / "part")])
    assert refused.exit_code == 3 and "shard S0's part of global checkpoint 2" in refused.output
    one = runner.invoke(
        app, ["syncer", "checkpoint", str(shards[0].job_dir), "--syncer", shards[0].url, "--out", str(tmp_path / "x")]
    )
    assert one.exit_code == 2 and "names S1 but no --syncer address answers as it" in one.output
    assert not (tmp_path / "x").exists()


def test_a_learner_colours_at_most_one_cut_past_the_last_marker_and_a_cut_survives_kill_9(
    shards: list[LocalSyncer],
) -> None:
    assembly = Assembly.build(small_job(learners=2, tokens=120_000, fragments=FRAGMENTS, inner_steps=8))
    learner = shards[0].client("L0")
    try:
        learner.register("L0", 1, "region-L0")
        assert learner.push(update_frame(assembly, 0, 1, {"L0": 1, "cut": 7}), 0)["status"] == "accepted"
        assert status(shards[0])["clock"]["cut"] == 0  # epoch 7 was never announced: no cut, no part written
        with pytest.raises(Refused, match="header x-ddctl-fragment says 0, the update is of fragment 1") as info:
            learner.push(update_frame(assembly, 1, 2, {"L0": 2}), 0)  # the header says 0; the frame is fragment 1
        assert info.value.code == "bad_request"
        headless = learner.http.post(  # without the header, the frame's own fragment is checked for its owner
            f"{shards[0].url}/v1/updates", content=update_frame(assembly, 1, 2, {"L0": 2}),
            headers={"content-type": "application/x-ddctl-frame"},
        )  # fmt: skip
        assert headless.status_code == 409 and "shard S0 does not own fragment 1" in headless.json()["reason"]
        learner.push(update_frame(assembly, 2, 3, {"L0": 3, "cut": 1}), 2)
        assert status(shards[0])["clock"]["cut"] == 1  # one past the last marker (none yet): cut before it is received
        learner.push(update_frame(assembly, 2, 4, {"L0": 4, "cut": 2}), 2)
        assert status(shards[0])["clock"]["cut"] == 1  # but not two: only a marker moves the shard past that
    finally:
        learner.close()
    shards[0].kill()
    restart(shards[0], "S0")
    after = status(shards[0])
    assert after["clock"]["cut"] == 1 and after["ledger"]["received"] == 3 * 8192
    admin = shards[0].client()
    try:
        part = admin.cut(1)  # the part the colour made, from disk after the restart
        assert part["part"]["cut"] == 1 and part["part"]["fragments"] == [0, 2]
        assert len(admin.cut_file(1, "model.safetensors", 1 << 30)) == part["files"]["model.safetensors"]["bytes"]
        with pytest.raises(Refused, match="no 'job.json' in a written part of checkpoint 1"):
            admin.cut_file(1, "job.json", 1 << 20)
        with pytest.raises(Refused, match="checkpoint epoch must be an integer"):
            admin.cut_file(1, "../secret", 1 << 20)
        with pytest.raises(Refused, match="field 'epoch': Input should be greater than or equal to 1"):
            admin.cut(0)
    finally:
        admin.close()
    learner = shards[0].client("L0")
    try:
        with pytest.raises(Refused, match="only the admin identity may take a global checkpoint"):
            learner.cut(2)
    finally:
        learner.close()


def test_a_shard_killed_mid_run_recovers_and_the_learners_carry_on(tmp_path: Path, longer_shards: list[LocalSyncer]) -> None:
    shards = longer_shards
    learners = {name: start_learner(tmp_path, shards, name) for name in ("L0", "L1")}
    try:
        wait_until(lambda: all(status(s)["rounds"] >= 2 for s in shards), timeout_s=120, what="rounds on both shards")
        shards[1].kill()
        time.sleep(2.0)  # learners retry S1's fragments and stream meanwhile; S0 goes on
        restart(shards[1], "S1")
        wait_learners(tmp_path, learners)
    finally:
        kill_left(learners)
    finals = wait_finished(shards)
    assert finals[1]["recovered"]["replayed"] > 0 or finals[1]["recovered"]["snapshot"]
    summaries = [json.loads((tmp_path / f"{name}.summary.json").read_text()) for name in learners]
    acked = sum(sum(s["acked_tokens"].values()) - s["acked_tokens"].get("duplicate", 0) for s in summaries)
    assert sum(f["ledger"]["received"] for f in finals) == acked
    assert all(f["ledger"]["balanced"] and f["ledger"]["pending"] == 0 for f in finals)
    assert all(s["reason"] == "finished" and s["drained"] for s in summaries)
    replays_bit_for_bit(shards)  # the shard's tape cut back to its snapshot, the log's updates taped again

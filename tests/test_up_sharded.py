"""``ddctl up`` with a sharded synchronizer (``synchronizer: shards: 2``) played by local processes, to the job's end:
each shard where the plan places it, learners routing to both, the dashboard drawing the job from both, the
controller joining the shards' final model, ``pull`` and ``replay --run`` of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from ddctl import providers
from ddctl.cli.app import app
from ddctl.control.rundir import RunDir
from ddctl.control.state import State
from ddctl.providers.base import InstanceSpec
from ddctl.providers.docker.engine import engine_unavailable
from ddctl.providers.process import ProcessProvider
from ddctl_agents.train.checkpoint import MANIFEST, read_manifest
from ddctl_agents.waiting import wait_until
from tests.builders import dry_run_up, instances_removed, regions_at, shards_finished

runner = CliRunner()
REGIONS = {
    "run": "sharded",
    "synchronizer": {"shards": 2},
    "training": {"preset": "tiny", "tokens": 300_000, "fragments": 4, "inner_steps": 8, "max_bytes": 1 << 21},
    "regions": [
        {"name": "east", "provider": "process", "learners": 1},
        {"name": "west", "provider": "process", "learners": 1},
    ],
}


def status(run: str = "sharded") -> dict[str, Any]:
    shown = runner.invoke(app, ["status", "--run", run, "--json"])
    assert shown.exit_code == 0, shown.output
    return dict(json.loads(shown.stdout))


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind",
    [
        "process",
        pytest.param("docker", marks=pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}")),
    ],
)
def test_up_runs_each_shard_where_the_plan_puts_it_and_ends_with_one_model(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Docker VMs each shard's container has an address of its own on every region's network (.250, .249)."""
    raw = {**REGIONS, "regions": [{**r, "provider": kind} for r in REGIONS["regions"]]}
    path = regions_at(tmp_path, monkeypatch, raw)
    plan = json.loads(runner.invoke(app, ["up", "-f", str(path), "--plan", "--json"]).stdout)
    placed = {s["index"]: (s["region"], s["fragments"]) for s in plan["synchronizer"]["shards"]}
    assert {i["name"]: i["region"] for i in plan["instances"] if i["role"] == "syncer"} == {
        "syncer": placed[0][0], "syncer-s1": placed[1][0]
    }  # fmt: skip
    made = dry_run_up(path)
    run = made["run"]
    try:
        running = [*providers.get(kind).list_run(run), *(ProcessProvider().list_run(run) if kind != "process" else [])]
        names = sorted(i.name for i in running if i.name != "metadata")  # Docker regions' metadata endpoint beside them
        assert names == ["L0", "L1", "controller", "syncer", "syncer-s1"]
        if kind == "docker":  # each learner is told S0 at its region network's .250 and S1 at .249 (and reaches them)
            with State() as state:
                learners = [r for r in state.instances(run) if r.role == "learner"]
                assert sorted(r.name for r in learners) == ["L0", "L1"]
                for record in learners:
                    argv = InstanceSpec.from_json(record.detail["spec"]).argv
                    hosts = [str(urlsplit(argv[i + 1]).hostname) for i, arg in enumerate(argv) if arg == "--syncer"]
                    assert [h.rpartition(".")[2] for h in hosts] == ["250", "249"], (record.name, hosts)
                    assert len({h.rpartition(".")[0] for h in hosts}) == 1, (record.name, hosts)
        assert len(RunDir(run).urls()) == 2 and made["shards"] == RunDir(run).urls() and made["url"] == made["shards"][0]
        shards = wait_until(lambda: (s := status())["shards"] and all(r["reachable"] for r in s["shards"]) and s,
                            timeout_s=60, what="both shards answering")  # fmt: skip
        rows = {row["shard"]: row for row in shards["shards"]}
        assert {name: (row["site"]["name"], row["owned"]) for name, row in rows.items()} == {
            "S0": placed[0], "S1": placed[1]
        }  # fmt: skip

        shown = runner.invoke(app, ["syncer", "status", "--run", run, "--json"])  # the shards' own table, by the run
        assert shown.exit_code == 0, shown.output
        assert [(r["shard"], r["owned"]) for r in json.loads(shown.stdout)["shards"]] == [
            ("S0", placed[0][1]),
            ("S1", placed[1][1]),
        ]

        # the controller's re-planner looks at the shards' measured links (a look every 10 s) and says what it saw
        look = wait_until(lambda: (r := status()["replanner"]) and r["utilisation"] is not None and r, timeout_s=60,
                          what="the re-planner's first look")  # fmt: skip
        assert look["error"] is None and look["utilisation"] > 0 and look["best"] > 0 and look["replans"] == 0

        # at the end the shards' books stand still (they linger for the controller): the dashboard's job is their sum
        finals = wait_until(shards_finished(run), timeout_s=240, what="both shards finished")
        job = status()
        assert job["rounds"] == sum(s["rounds"] for s in finals) > 0
        for key in ("received", "merged", "late_merged", "dropped", "pending"):
            assert job["ledger"][key] == sum(s["ledger"][key] for s in finals), key
        assert job["tokens"]["trained"] == max(s["tokens"]["trained"] for s in finals) > 0  # the learners', once
        owners = {p: s for s in sorted(finals, key=lambda s: s["shard"]["epoch"]) for p in s["shard"]["owned"]}
        assert job["versions"] == [owners[p]["versions"][p] for p in range(4)]  # each fragment's, at its owner at the end
        # the links read idle (a CI run moved a fragment at 1% of its link, then drew the job mid-handoff): none moved
        assert job["replanner"]["replans"] == 0 and {s["shard"]["epoch"] for s in finals} == {r["epoch"] for r in rows.values()}
        assert [finals.index(owners[p]) for p in range(4)] == [shard_of(p, placed) for p in range(4)]
        assert job["bytes"]["sent"] == sum(s["bytes_up"] + s["bytes_down"] for s in finals)

        def concluded() -> dict[str, Any] | None:
            runs = json.loads(runner.invoke(app, ["ls", "--json"]).stdout)["runs"]
            return next((r for r in runs if r["run"] == run and r["state"] == "finished"), None)

        row = wait_until(concluded, timeout_s=120, what="the controller to record the result")
        final = RunDir(run).final
        assert row["result"] == str(final)
        summary = status()["job"]["summary"]
        manifest = read_manifest((final / MANIFEST).read_bytes())
        assert summary["val_bpb"] == pytest.approx(manifest.val_bpb, abs=1e-5) and summary["val_bpb"] < 4.5
        assert summary["tokens"]["merged"] == sum(s["tokens"]["merged"] for s in finals)
        assert summary["rounds"] == sum(s["rounds"] for s in finals) == manifest.rounds
        assert summary["learners_finished"] == ["L0", "L1"]
        assert [i.name for i in providers.get(kind).list_run(run) if i.alive and i.name != "controller"] == []

        pulled = runner.invoke(app, ["pull", "--run", run, "--out", str(tmp_path / "model"), "--json"])
        assert pulled.exit_code == 0, pulled.output
        assert json.loads(pulled.stdout)["val_bpb"] == pytest.approx(manifest.val_bpb)
        replayed = runner.invoke(app, ["replay", "--run", run, "--json"])  # both shards' tapes, found by the run
        assert replayed.exit_code == 0, replayed.output
        again = json.loads(replayed.stdout)
        assert again["match"] and again["shards"] == 2 and again["val_bpb"] == pytest.approx(manifest.val_bpb, abs=1e-5)
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output
    assert ProcessProvider().list_run(run) == [] and providers.get(kind).list_run(run) == []
    assert set(instances_removed(json.loads(down.stdout))) <= {"controller"}  # the controller removed the rest


def shard_of(fragment: int, placed: dict[int, tuple[str, list[int]]]) -> int:
    return next(index for index, (_, fragments) in placed.items() if fragment in fragments)


@pytest.mark.slow
def test_a_sharded_run_checkpoints_on_its_schedule_and_a_new_sharded_run_resumes_from_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller takes the shards' global checkpoint every 12 rounds the job merged, keeps the newest two (its
    final model the newest), ``pull`` lists and fetches them, and a new sharded run starts every shard from one: the
    versions and books go on from the checkpoint's, the books split between the shards so they still add up."""
    from ddctl.control.state import State

    # long enough for the controller's looks (every 10 s) to find 12 rounds merged: at 200,000 tokens the job ended in
    # 11 s on a quiet machine, before any look found a checkpoint due
    raw = {**REGIONS, "run": "scheduled", "training": {**REGIONS["training"], "tokens": 400_000},
           "checkpoints": {"every_rounds": 12, "every_minutes": 0, "keep_last": 2}}  # fmt: skip
    path = regions_at(tmp_path, monkeypatch, raw)
    run = dry_run_up(path)["run"]
    try:
        summary = concluded(run)
        with State() as state:
            taken = [e for e in state.events(run) if e["kind"] == "checkpoint"]
            figures = state.run(run).detail["checkpoints"]  # type: ignore[union-attr]
        assert taken and all(e["rounds"] >= 12 * (i + 1) for i, e in enumerate(taken)), taken  # on the schedule
        assert [e["cut"] for e in taken] == sorted({e["cut"] for e in taken})  # each a new consistent cut
        assert figures["taken"] == len(taken) and figures["error"] is None and figures["name"] == taken[-1]["name"]
        listed = runner.invoke(app, ["pull", "--run", run, "--list", "--json"])
        assert listed.exit_code == 0, listed.output
        entries = json.loads(listed.stdout)["checkpoints"]
        newest = f"ckpt-{len(taken) + 1:06d}"  # the periodic ones, then the final model
        assert [e["name"] for e in entries] == [taken[-1]["name"], newest]  # keep_last: 2
        final = RunDir(run).final
        kept = RunDir(run).global_checkpoints / newest
        assert (kept / "model.safetensors").read_bytes() == (final / "model.safetensors").read_bytes()
        assert entries[-1]["rounds"] == summary["rounds"]
        assert entries[-1]["val_bpb"] == pytest.approx(summary["val_bpb"], abs=1e-5)
        out = str(tmp_path / "older")
        older = runner.invoke(app, ["pull", "--run", run, "--checkpoint", taken[-1]["name"], "--out", out, "--json"])
        assert older.exit_code == 0, older.output
        assert json.loads(older.stdout)["rounds"] == taken[-1]["rounds"] < summary["rounds"]
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output

    start = read_manifest((final / MANIFEST).read_bytes())
    raw |= {"run": "resumed", "training": {**raw["training"], "tokens": 600_000}}
    path.write_text(yaml.safe_dump(raw))
    up = runner.invoke(app, ["up", "-f", str(path), "--dry-run", "--resume-from", str(RunDir(run).global_checkpoints), "--json"])
    assert up.exit_code == 0, up.output
    try:
        assert json.loads(up.stdout)["resumed_from"]["rounds"] == start.rounds
        first = status("resumed")
        assert all(v >= s for v, s in zip(first["versions"], start.versions, strict=True))  # every shard's, from the start
        assert first["ledger"]["merged"] >= 4 * start.tokens["merged"]  # fragment-tokens: the books go on, not twice
        summary = concluded("resumed")
        trained_here = 200_000  # the budget's last third: each learner from its recorded step to its share's end
        assert start.tokens["merged"] < summary["tokens"]["merged"] <= start.tokens["merged"] + trained_here
        assert summary["val_bpb"] is not None and summary["val_bpb"] < 4.5
    finally:
        down = runner.invoke(app, ["down", "--run", "resumed", "--json"])
    assert down.exit_code == 0, down.output
    assert ProcessProvider().list_run("resumed") == []


def concluded(run: str) -> dict[str, Any]:
    """The run's result, once the controller has recorded it (the shards' joined model on disk)."""

    def recorded() -> bool:
        runs = json.loads(runner.invoke(app, ["ls", "--json"]).stdout)["runs"]
        return any(r["run"] == run and r["state"] == "finished" for r in runs)

    wait_until(recorded, timeout_s=300, what=f"the controller to record run {run}'s result")
    return dict(status(run)["job"]["summary"])

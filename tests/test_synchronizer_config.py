"""regions.yaml's synchronizer: section, the plan `up --plan` shows from it, and what `up` refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.config import synchronizer
from ddctl.config.regions import job_config, parse_regions
from ddctl.control.quotes import sync_traffic
from ddctl.errors import RegionsError

FIVE: dict[str, Any] = {
    "run": "wan",
    "synchronizer": {"shards": "auto"},
    "training": {"preset": "tiny", "tokens": 2_000_000},
    "regions": [
        {"name": n, "provider": "process", "learners": k, "link": {"up_mbps": mbps, "down_mbps": mbps}}
        for n, k, mbps in [("a", 2, 1000), ("b", 2, 1000), ("c", 2, 1000), ("d", 1, 200), ("e", 1, 50)]
    ],
}


def parse(raw: dict[str, Any]) -> Any:
    return parse_regions(raw, Path("regions.yaml"))


def with_key(**changes: Any) -> dict[str, Any]:
    return {**FIVE, **changes}


def test_the_old_syncer_key_is_one_synchronizer_in_its_region() -> None:
    raw = {k: v for k, v in FIVE.items() if k != "synchronizer"} | {"syncer": "d"}
    rf = parse(raw)
    plan = synchronizer.summary(rf, job_config(rf))
    assert rf.syncer == "d" and [s["region"] for s in plan["shards"]] == ["d"]
    assert plan["shards"][0]["fragments"] == list(range(24))


def test_a_section_places_the_synchronizer_where_the_plan_puts_its_first_shard() -> None:
    rf = parse(FIVE)
    plan = synchronizer.summary(rf, job_config(rf))
    assert [s["region"] for s in plan["shards"]] == ["a", "b", "c"]
    assert rf.syncer == "a"
    assert plan["over_bound"] >= 1.0 and plan["utilisation"] >= plan["bound"] - 1e-9
    only_d = parse(with_key(synchronizer={"regions": ["d"]}))
    assert only_d.syncer == "d"


def test_predicted_loads_are_the_jobs_bytes_over_its_period() -> None:
    """Region d hosts no shard: it sends one upload and pulls one version per learner per period, nothing else."""
    rf = parse(FIVE)
    job = job_config(rf)
    plan = synchronizer.summary(rf, job)
    d = next(s for s in plan["sites"] if s["region"] == "d")
    traffic = sync_traffic(job)
    period = job.sync.inner_steps * synchronizer.step_prior(rf.region("d"), job, synchronizer.parameters(job))
    assert d["shards"] == [] and d["cadence"] == 1 and d["relay"] is False
    assert d["egress_mbps"] == pytest.approx(traffic.up_bytes * 8 / 1e6 / period, abs=1e-3)
    assert d["ingress_mbps"] == pytest.approx(traffic.down_bytes * 8 / 1e6 / period, abs=1e-3)
    assert d["utilisation"] == pytest.approx(max(d["egress_mbps"], d["ingress_mbps"]) / 200, abs=1e-4)
    a = next(s for s in plan["sites"] if s["region"] == "a")
    assert a["relay"] is True and a["ingress_mbps"] > 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"syncer": "a"}, "not both"),
        ({"synchronizer": {"regions": ["north"]}}, "synchronizer.regions: 'north' is not a region here; allowed: a, b, c, d, e"),
        ({"synchronizer": {"shards": 0}}, "synchronizer.shards: must be >= 1; allowed: auto, or a number of shards"),
        ({"synchronizer": {"shards": "many"}}, "synchronizer.shards: must be int, got 'many'; allowed: auto"),
        ({"synchronizer": {"shards": 25}}, "shards must be 1..24"),
        ({"synchronizer": {"relays": "yes"}}, "synchronizer.relays"),
        ({"synchronizer": {"replan": {"gain": 2}}}, "synchronizer.replan.gain: must be < 1"),
        ({"synchronizer": {"replan": {"min_utilisation": 1}}}, "synchronizer.replan.min_utilisation: must be < 1"),
        ({"synchronizer": {"replan": {"min_utilisation": -0.1}}}, "synchronizer.replan.min_utilisation: must be >= 0"),
        ({"synchronizer": {"shard": 2}}, "did you mean 'shards'"),
    ],
)
def test_bad_sections_are_refused_with_the_key(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(RegionsError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse(with_key(**changes))


def test_neither_key_is_refused() -> None:
    with pytest.raises(RegionsError, match="syncer: required .*or a synchronizer: section; allowed: a, b, c, d, e"):
        parse({k: v for k, v in FIVE.items() if k != "synchronizer"})


def test_a_cadence_must_be_one_of_the_allowed() -> None:
    regions = [*FIVE["regions"][:4], {**FIVE["regions"][4], "cadence": 3}]
    with pytest.raises(RegionsError, match=r"regions\[4\]\.cadence: 3 is not a cadence; allowed: auto, 1, 2, 4, 8"):
        parse(with_key(regions=regions))
    fixed = parse(with_key(regions=[*FIVE["regions"][:4], {**FIVE["regions"][4], "cadence": 8}]))
    assert next(s for s in synchronizer.summary(fixed, job_config(fixed))["sites"] if s["region"] == "e")["cadence"] == 8


def test_up_runs_shards_where_every_learner_reaches_them_and_runs_a_fixed_cadence() -> None:
    rf = parse(FIVE)
    docker = dict.fromkeys((r.name for r in rf.regions), "docker")
    gcp = dict.fromkeys((r.name for r in rf.regions), "gcp")
    placed = synchronizer.runnable_plan(rf, job_config(rf), gcp)  # each shard on a VM of its own, behind its own address
    assert len(placed.shards) == 3
    sites = sorted({s.site for s in placed.shards})
    mixed = {**dict.fromkeys((r.name for r in rf.regions), "process"), "e": "aws"}  # the shards' regions on this machine
    with pytest.raises(
        RegionsError,
        match=rf"synchronizer.regions: the plan puts shards in {', '.join(sites)} .* on this machine that aws VMs cannot "
        "reach; allowed: cloud regions only",
    ):
        synchronizer.runnable_plan(rf, job_config(rf), mixed)
    learners_here = {**dict.fromkeys((r.name for r in rf.regions), "process"), **dict.fromkeys(sites, "aws")}
    assert len(synchronizer.runnable_plan(rf, job_config(rf), learners_here).shards) == 3  # they reach aws's shards
    for local in (docker, dict.fromkeys((r.name for r in rf.regions), "process")):
        assert len(synchronizer.runnable_plan(rf, job_config(rf), local).shards) == 3
    one = parse(with_key(synchronizer={"shards": 1}))
    synchronizer.runnable_plan(one, job_config(one), docker)
    slow = parse(with_key(synchronizer={"shards": 1}, regions=[*FIVE["regions"][:4], {**FIVE["regions"][4], "cadence": 2}]))
    assert (
        synchronizer.runnable_plan(slow, job_config(slow), docker).cadence["e"] == 2
    )  # its learners get --cadence 2 (test_specs)


def test_up_plan_shows_the_shard_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(FIVE))
    runner = CliRunner()
    result = runner.invoke(app, ["up", "-f", str(path), "--plan", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["syncer_region"] == "a" and len(plan["synchronizer"]["shards"]) == 3
    text = runner.invoke(app, ["up", "-f", str(path), "--plan", "--dry-run"], env={"COLUMNS": "220"})
    assert text.exit_code == 0, text.output
    assert "synchronizer: 3 shard(s)" in text.stdout and "every 1" in text.stdout
    syncers = {i["name"]: i["region"] for i in plan["instances"] if i["role"] == "syncer"}  # a process per shard
    assert syncers == {
        ("syncer" if s["index"] == 0 else f"syncer-s{s['index']}"): s["region"] for s in plan["synchronizer"]["shards"]
    }


def test_the_replan_section_reaches_the_running_replanner() -> None:
    from ddctl.control.replanning import for_job
    from ddctl_agents.core.replan import ReplanSettings

    knobs = {"gain": 0.3, "confirmations": 2, "dwell_s": 5.0, "max_moves": 1, "min_utilisation": 0.25}
    for raw, settings in ((with_key(synchronizer={"replan": knobs}), ReplanSettings(**knobs)), (FIVE, ReplanSettings())):
        rf = parse(raw)
        loop = for_job(rf, job_config(rf), ["https://s0"], lambda url: None, {"S0": "a"})  # type: ignore[arg-type,return-value]
        assert loop.planner.settings == settings
    assert ReplanSettings().min_utilisation == 0.5

"""The scale ladder: its plan, its arithmetic, and one real (very short) rung through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddctl.bench.ladder import TOKENS_PER_PARAM, parameters, plan, summarize
from ddctl.cli.app import app
from ddctl_agents.errors import ConfigError


def test_each_rung_trains_twenty_tokens_per_parameter_for_every_arm_and_seed() -> None:
    runs = plan(["micro", "mini"], [0, 1], ["dp_m4", "decoupled_m4"], TOKENS_PER_PARAM)
    assert len(runs) == 2 * 2 * 2
    assert {r.rung: r.tokens for r in runs} == {"micro": 20 * parameters("micro"), "mini": 20 * parameters("mini")}
    assert parameters("micro") < parameters("mini") < parameters("tiny")


@pytest.mark.parametrize(
    ("rungs", "arms", "per_param", "needle"),
    [
        (["small"], ["dp_m4"], 20, "rung small needs a GPU"),
        (["huge"], ["dp_m4"], 20, "unknown huge; rungs: micro, mini, tiny"),
        (["micro"], ["dp_m3"], 20, "unknown dp_m3"),
        (["micro"], ["dp_m4"], 0, "tokens per parameter must be in (0, 1000]"),
        ([], ["dp_m4"], 20, "at least one rung"),
    ],
)
def test_bad_plans_are_refused_with_what_is_allowed(rungs: list[str], arms: list[str], per_param: float, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        plan(rungs, [0], arms, per_param)


def row(rung: str, arm: str, seed: int, bpb: float, bpt: float) -> dict[str, object]:
    return {"rung": rung, "arm": arm, "seed": seed, "val_bpb": bpb, "bytes_per_token": bpt, "wall_s": 1.0, "tokens": 100}


def test_the_summary_averages_seeds_divides_by_dp_and_reads_the_trend() -> None:
    rows = [
        row("micro", "dp_m4", 0, 3.0, 1000.0), row("micro", "dp_m4", 1, 3.2, 1000.0),
        row("micro", "decoupled_m4", 0, 3.6, 10.0), row("micro", "decoupled_m4", 1, 3.4, 10.0),
        row("mini", "dp_m4", 0, 2.0, 2000.0), row("mini", "decoupled_m4", 0, 2.1, 20.0),
    ]  # fmt: skip
    out = summarize(rows, {"micro": 10, "mini": 20})
    micro = out["rungs"]["micro"]["arms"]
    assert micro["dp_m4"]["val_bpb"] == pytest.approx(3.1) and micro["dp_m4"]["val_bpb_stdev"] == pytest.approx(0.1414, rel=1e-3)
    assert micro["decoupled_m4"]["val_bpb_over_dp"] == pytest.approx(3.5 / 3.1)
    assert micro["decoupled_m4"]["dp_bytes_per_token_over_this"] == pytest.approx(100.0)
    assert out["m4_over_dp_by_rung"] == pytest.approx({"micro": 3.5 / 3.1, "mini": 2.1 / 2.0})
    assert out["m4_ratio_falls_with_scale"] is True
    rows[-1] = row("mini", "decoupled_m4", 0, 2.5, 20.0)  # 1.25 at the larger rung: it does not fall
    assert summarize(rows, {"micro": 10, "mini": 20})["m4_ratio_falls_with_scale"] is False
    assert summarize(rows[:4], {"micro": 10})["m4_ratio_falls_with_scale"] is None  # one rung says nothing


@pytest.mark.slow
def test_a_short_rung_runs_end_to_end_and_reports_what_it_trained(tmp_path: Path) -> None:
    out = tmp_path / "ladder.json"
    args = ["bench", "ladder", "--rungs", "micro", "--arms", "dp_m4,decoupled_m4", "--tokens-per-param", "0.1"]
    result = CliRunner().invoke(app, [*args, "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed == json.loads(out.read_text())
    runs = {r["arm"]: r for r in printed["runs"]}
    assert set(runs) == {"dp_m4", "decoupled_m4"}
    for r in runs.values():
        assert r["tokens"] >= 0.9 * 0.1 * parameters("micro")  # whole steps: a little under the budget
        assert 0 < r["val_bpb"] < 8.0  # learned something: a uniform guess over bytes is 8 bits
    ratio = printed["rungs"]["micro"]["arms"]["decoupled_m4"]["val_bpb_over_dp"]
    assert ratio == pytest.approx(runs["decoupled_m4"]["val_bpb"] / runs["dp_m4"]["val_bpb"])
    assert runs["dp_m4"]["bytes_per_token"] > 10 * runs["decoupled_m4"]["bytes_per_token"]

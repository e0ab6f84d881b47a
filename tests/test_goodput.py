"""The goodput simulator: determinism, accounting, limits, the paper's table, and its CLI."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.errors import SimError
from ddctl.goodput.grid import CALIBRATED_ON, grid, run_cells
from ddctl.goodput.params import YEAR_S, SimParams, parse_chips, parse_duration
from ddctl.goodput.system import simulate_cell
from ddctl.goodput.timeline import outages_from_tape
from ddctl_agents.errors import TapeError

runner = CliRunner()
SHORT = SimParams(days=1.0)


def test_a_seed_gives_the_same_run_and_another_seed_another() -> None:
    a, b = simulate_cell("decoupled_m4", 600_000, SHORT, 3), simulate_cell("decoupled_m4", 600_000, SHORT, 3)
    assert (a.goodput, a.uptime, a.lost, a.failures) == (b.goodput, b.uptime, b.lost, b.failures)
    assert simulate_cell("decoupled_m4", 600_000, SHORT, 4).goodput != a.goodput


@pytest.mark.parametrize("system", ["dp", "elastic_dp", "decoupled_m2", "decoupled_m16"])
@pytest.mark.parametrize(
    "params", [SHORT, replace(SHORT, jitter=0.02), replace(SHORT, slice_chips=65_536, repair_scale_s=20_000)]
)
def test_every_chip_second_is_useful_or_lost_to_one_cause(system: str, params: SimParams) -> None:
    run = simulate_cell(system, 1_200_000, params, 0)
    for unit in run.units:  # per unit (so per chip of it): useful + lost = allocated
        assert unit.useful + sum(unit.lost.values()) == pytest.approx(unit.chips * params.horizon_s, rel=1e-9)
        assert all(v >= 0 for v in unit.lost.values())
    assert run.useful + sum(run.lost.values()) == pytest.approx(run.allocated, rel=1e-9)
    if params.jitter:
        assert run.lost["straggler"] > 0  # synchronous steps wait for the slowest slice


def test_a_quorum_above_one_blocks_learners_and_the_books_still_balance() -> None:
    params = replace(SHORT, quorum=4, slice_chips=100_000, repair_scale_s=5_000)  # few slices: learners go dark
    run = simulate_cell("decoupled_m4", 400_000, params, 0)
    assert run.lost["blocked"] > 0 and run.uptime < 1.0
    assert run.useful + sum(run.lost.values()) == pytest.approx(run.allocated, rel=1e-9)
    assert run.goodput < simulate_cell("decoupled_m4", 400_000, replace(params, quorum=1), 0).goodput


def test_no_failures_is_full_goodput_and_one_learner_is_elastic_data_parallel() -> None:
    calm = replace(SHORT, mtbi_s=1e15 * YEAR_S)
    for system in ("dp", "elastic_dp", "decoupled_m8"):
        run = simulate_cell(system, 300_000, calm, 0)
        assert (run.goodput, run.uptime) == (pytest.approx(1.0), pytest.approx(1.0))
    one = simulate_cell("decoupled_m1", 600_000, SHORT, 1)
    elastic = simulate_cell("elastic_dp", 600_000, SHORT, 1)
    assert one.goodput == pytest.approx(elastic.goodput, abs=1e-9) and one.uptime == pytest.approx(elastic.uptime, abs=1e-9)


def test_m_learners_are_about_one_elastic_job_of_n_over_m_chips() -> None:
    cells = run_cells(
        [("decoupled_m8", 1_200_000), ("elastic_dp", 150_000), ("decoupled_m4", 1_200_000), ("elastic_dp", 300_000)],
        replace(SHORT, days=2.0),
        seeds=3,
        jobs=1,
    )
    m8, el150, m4, el300 = (c.goodput.mean for c in cells)
    assert abs(m8 - el150) < 1.5 and abs(m4 - el300) < 1.5
    assert m8 > m4  # more, smaller learners lose less to each failure


def test_the_grid_reproduces_the_papers_table_in_under_30_seconds() -> None:
    started = time.monotonic()
    table = grid(SimParams(), seeds=5)
    seconds = time.monotonic() - started
    assert seconds < 30, seconds  # 5 seeds x 7 days per cell, 30 cells, on this machine's cores
    assert table["days"] >= 7 and table["seeds"] == 5
    errors = {(s, c): e for s, row in table["error"].items() for c, e in row.items()}
    assert all(abs(e) <= 3 for (s, _), e in errors.items() if s in CALIBRATED_ON), errors
    predicted = [abs(e) for (s, _), e in errors.items() if s not in CALIBRATED_ON]
    # predicted, not fitted: within 3 points in all but one cell (M=4 at 2.4M, where the paper sits 4 points
    # above its own elastic job of the same learner size), and within 4 there
    assert sum(e > 3 for e in predicted) <= 1 and max(predicted) <= 4, errors
    for m in (4, 8, 16):
        assert all(v >= 99 for v in table["uptime"][f"decoupled_m{m}"].values())


def test_goodput_rises_with_mtbi_and_falls_with_repair_time() -> None:
    result = runner.invoke(
        app, ["simulate", "--sensitivity", "--chips", "1.2m", "--learners", "8", "--seeds", "2", "--days", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    at = {(r["mtbi_years"], r["repair_mean_s"]): r for r in rows}
    repairs = sorted({r["repair_mean_s"] for r in rows})
    for system in ("elastic_dp", "decoupled_m8"):
        assert at[(0.5, repairs[1])][system] < at[(1.0, repairs[1])][system] < at[(2.0, repairs[1])][system]
        assert at[(1.0, repairs[0])][system] >= at[(1.0, repairs[2])][system]


def test_one_cell_and_the_grid_as_json(tmp_path: Path) -> None:
    cell = runner.invoke(app, ["simulate", "--chips", "1.2m", "--learners", "8", "--seeds", "2", "--days", "1", "--json"])
    assert cell.exit_code == 0, cell.output
    data = json.loads(cell.stdout)
    assert data["chips"] == 1_200_000 and set(data["systems"]) == {"dp", "elastic_dp", "decoupled_m8"}
    assert (
        data["systems"]["decoupled_m8"]["goodput"] > data["systems"]["elastic_dp"]["goodput"] > data["systems"]["dp"]["goodput"]
    )
    png = tmp_path / "grid.png"
    table = runner.invoke(app, ["simulate", "--grid", "--seeds", "2", "--days", "1", "--json", "--plot", str(png)])
    assert table.exit_code == 0, table.output
    data = json.loads(table.stdout)
    systems = ["dp", "elastic_dp", "decoupled_m2", "decoupled_m4", "decoupled_m8", "decoupled_m16"]
    for key in ("goodput", "uptime"):
        assert set(data[key]) == set(systems)
        assert all(set(row) == {"150000", "300000", "600000", "1200000", "2400000"} for row in data[key].values())
        assert all(0 <= v <= 100 for row in data[key].values() for v in row.values())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chips", "12x"], "must be a count like 150k, 1.2m or 4096"),
        (["--mtbi", "soon"], "must be a positive number with a unit"),
        (["--learners", "4", "--quorum", "5"], "quorum must be between 1 and the learners (4)"),
        (["--chips", "3", "--learners", "8"], "decoupled_m8 needs at least 8 chips"),
    ],
)
def test_bad_input_says_what_is_wrong_and_what_is_allowed(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["simulate", "--seeds", "1", "--days", "0.1", *args])
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_sizes_and_durations_parse() -> None:
    assert [parse_chips(t) for t in ("150k", "1.2m", "2.4M", "4096")] == [150_000, 1_200_000, 2_400_000, 4096]
    assert parse_duration("1y") == YEAR_S and parse_duration("90d") == 90 * 86400 and parse_duration("30") == 30
    with pytest.raises(SimError):
        SimParams(restart_s=-1)


def test_a_tape_with_learners_the_run_does_not_have_is_refused(tmp_path: Path) -> None:
    tape = tmp_path / "t.jsonl"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--chips",
            "2.4m",
            "--learners",
            "4",
            "--seeds",
            "1",
            "--days",
            "0.1",
            "--tape",
            str(tape),
            "--tape-seconds",
            "300",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tape"]["outages"] > 0
    assert outages_from_tape(tape, 4)
    with pytest.raises(TapeError, match="the run has 2 learners"):
        outages_from_tape(tape, 2)
    again = runner.invoke(app, ["simulate", "--seeds", "1", "--days", "0.1", "--tape", str(tape)])
    assert again.exit_code == 2 and "exists" in again.stderr  # never overwrites


@pytest.mark.slow
def test_a_simulated_timeline_drives_a_real_training_run(tmp_path: Path) -> None:
    timeline, run_tape = tmp_path / "timeline.jsonl", tmp_path / "run.jsonl"
    made = runner.invoke(
        app,
        [
            "simulate",
            "--chips",
            "2.4m",
            "--learners",
            "2",
            "--seeds",
            "1",
            "--days",
            "0.1",
            "--tape",
            str(timeline),
            "--tape-seconds",
            "60",
            "--json",
        ],
    )
    assert made.exit_code == 0, made.output
    recorded = [json.loads(line) for line in timeline.read_text().splitlines()]
    away = [(r["type"], r["learner"], r["t"]) for r in recorded if r["type"] in ("failure", "join")]
    assert away, "the timeline has at least one outage in its first 60 s"
    trained = runner.invoke(
        app, ["train", "--learners", "2", "--tokens", "150000", "--failures", str(timeline), "--tape", str(run_tape), "--json"]
    )
    assert trained.exit_code == 0, trained.output
    end = json.loads(trained.stdout)["virtual_time_s"]
    seen = [json.loads(line) for line in run_tape.read_text().splitlines()]
    replayed = [(r["type"], r["learner"], r["t"]) for r in seen if r["type"] in ("failure", "join") and r["t"] > 0]
    expected = [(kind, learner, t) for kind, learner, t in away if t < end]
    assert [(k, n) for k, n, _ in replayed] == [(k, n) for k, n, _ in expected]
    assert [t for *_, t in replayed] == pytest.approx([t for *_, t in expected], abs=1e-6)

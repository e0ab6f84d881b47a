"""``ddctl bench cadence``: a learner on a shaped link at cadence 1 against 4; every figure is what it claims."""

from __future__ import annotations

import re
import subprocess

import pytest
from typer.testing import CliRunner

from ddctl.bench.cadence import measure_cadence
from ddctl.cli.app import app
from ddctl.errors import DdctlError
from ddctl.providers.linkshape import available

BAD = [
    ([3], 100_000, 3, "cadences must be some of 1, 2, 4, 8, got [3]"),
    ([], 100_000, 3, "cadences must be some of"),
    ([1], 1000, 3, "tokens must be >= 50000"),
    ([1], 100_000, 0, "parallel must be in [1, 8] uploads in flight, got 0"),
]


@pytest.mark.parametrize(("cadences", "tokens", "parallel", "message"), BAD)
def test_bad_sizes_are_refused_before_any_link_is_made(cadences: list[int], tokens: int, parallel: int, message: str) -> None:
    with pytest.raises(DdctlError, match=re.escape(message)):
        measure_cadence(4.0, cadences, tokens, parallel)
    done = CliRunner().invoke(app, ["bench", "cadence", "--cadences", "3", "--json"])
    assert done.exit_code == 2 and "cadences must be some of 1, 2, 4, 8" in done.output


def test_the_cadence_table_shows_the_rows_figures() -> None:
    from rich.console import Console

    from ddctl.bench.report import cadence_table

    row = {"cadence": 4, "l1": {"bytes": 12_300_000}, "x_first": {"l1_bytes": 0.31}, "link_load": 0.62, "l1_efficiency": 0.912,
           "job_efficiency": 0.95, "ledger": {"dropped": 1024}, "val_bpb": 4.107, "wall_s": 31.2}  # fmt: skip
    console = Console(width=200, record=True)
    console.print(cadence_table({"rate_mbit": 4.0, "tokens": 300_000, "rows": [row]}))
    text = console.export_text()
    for cell in ("every 4H", "12.3", "0.31", "0.62", "0.912", "0.950", "1,024", "4.107", "31", "4 Mbit/s"):
        assert cell in text, cell


@pytest.mark.slow
@pytest.mark.skipif(available() is not None, reason=f"{available()}")
def test_a_slow_learner_at_cadence_4_moves_a_quarter_of_the_bytes_and_its_figures_follow_from_them() -> None:
    result = measure_cadence(rate_mbit=4.0, cadences=(1, 4), tokens=120_000)
    every, fourth = result["rows"]
    assert (every["cadence"], fourth["cadence"]) == (1, 4)
    for row in result["rows"]:
        l1 = row["l1"]
        assert l1["bytes"] == l1["bytes_up"] + l1["bytes_down"]
        busier = max(l1["bytes_up"], l1["bytes_down"]) * 8 / l1["train_seconds"] / 1e6 / 4.0
        assert row["link_load"] == pytest.approx(busier, rel=1e-3)
        assert row["l1_efficiency"] == pytest.approx(l1["accepted_tokens"] / l1["trained_tokens"], abs=1e-4)
        assert l1["accepted_tokens"] == l1["acked_tokens"].get("accepted", 0) + l1["acked_tokens"].get("late", 0)
        assert row["ledger"]["balanced"]
        assert row["x_first"]["l1_bytes"] == pytest.approx(l1["bytes"] / every["l1"]["bytes"], rel=1e-3)
    # Up: an update every 4 periods (plus the final flush). At cadence 1 the 4 Mbit/s uplink is the bound, and a queued
    # update absorbs the next (one upload for two): how many go up is the link's time over the training's, which a
    # faster machine shortens (CI at ce011aa: 2.38 MB against cadence 4's 1.54, 0.65x). So the schedule is counted in
    # updates made (uploaded + absorbed), and bytes follow from uploads at the same bytes each (here 32 against 11,
    # 140 kB per upload at both).
    for row in result["rows"]:
        assert row["l1"]["updates"] == row["l1"]["uploads"] + row["l1"]["absorbed"] and row["l1"]["uploads"] > 0
    assert fourth["l1"]["updates"] < 0.45 * every["l1"]["updates"]
    per_upload = [row["l1"]["bytes_up"] / row["l1"]["uploads"] for row in result["rows"]]
    assert per_upload[1] == pytest.approx(per_upload[0], rel=0.2)
    assert fourth["x_first"]["l1_bytes"] < 0.7
    assert fourth["link_load"] < every["link_load"]
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "ddctl-cad" not in namespaces  # nothing left behind

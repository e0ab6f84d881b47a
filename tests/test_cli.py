from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddctl.cli.app import app

runner = CliRunner()
SMALL = [
    "--tokens",
    "16000",
    "--learners",
    "2",
    "--fragments",
    "4",
    "--inner-steps",
    "8",
    "--batch-size",
    "4",
    "--max-bytes",
    str(1 << 20),
]


def test_train_json_has_the_promised_keys(tmp_path: Path) -> None:
    tape = tmp_path / "t.jsonl"
    result = runner.invoke(app, ["train", *SMALL, "--tape", str(tape), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"val_bpb", "tokens", "bytes_up", "bytes_down", "wall_s", "params_sha256"} <= set(data)
    assert data["val_bpb"] < 8.0 and data["tokens"] >= 16000
    replay = runner.invoke(app, ["replay", str(tape), "--json"])
    assert replay.exit_code == 0, replay.output
    assert json.loads(replay.stdout)["params_sha256"] == data["params_sha256"]


def test_plain_output_has_no_colour_codes_when_not_a_terminal() -> None:
    result = runner.invoke(app, ["train", *SMALL, "--learners", "1"])
    assert result.exit_code == 0, result.output
    assert "val_bpb" in result.stdout and "\x1b[" not in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--learners", "0"], "learners must be in [1, 64], got 0"),
        (["--speeds", "1,fast"], "--speeds '1,fast' must be comma-separated numbers"),
        (["--speeds", "1,1,1"], "give one speed per learner (2), got 3"),
        (["--outage", "soon"], "outage 'soon' must look like LEARNER@SECONDS[+SECONDS]"),
        (["--outage", "5@10"], "outage learners must be < learners (2)"),
        (["--fragments", "500"], "fragments must be in [1, 64] (the number of tensors)"),
        (["--quorum", "0"], "quorum must be >= 1"),
        (["--data", "/nonexistent/corpus"], "/nonexistent/corpus"),
        (["--down-codec", "int4"], "Invalid value for '--down-codec'"),
        (["--preset", "huge"], "huge"),
        (["--shards", "5"], "shards (5) must not outnumber fragments (4): a shard owns whole fragments"),
        (["--shards", "0"], "Invalid value for '--shards'"),
        (["--lr", "inf"], "lr must be a finite number > 0, got inf"),  # with --tape it wrote an empty tape, then crashed
        (["--latency-ms", "inf"], "latency_ms must be in [0, 60000], got inf"),  # it gave Infinity in --json
        (["--quorum", "3"], "quorum (3) must be at most the learners (2)"),  # it ran as K = M, silently
        (["--learners", "1", "--quorum", "2"], "quorum (2) must be at most the learners (1)"),  # not the default 4
        (["--tokens", str(2**53 + 1)], "tokens must be in [1, 2**53], got 9007199254740993"),  # trained until stopped
        # a batch past memory: the allocator's traceback from inside the step until now, in each way of training
        (["--batch-size", "1000000000000"], "an inner step of batch_size 1000000000000 sequences of"),
        (["--baseline", "dp", "--batch-size", "1000000000000"], "does not fit in the cpu memory"),
    ],
)
def test_bad_input_exits_2_with_a_message_naming_what_is_allowed(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["train", *SMALL, *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_the_baseline_refuses_what_only_a_decoupled_run_uses(tmp_path: Path) -> None:
    args = ["train", *SMALL, "--baseline", "dp", "--shards", "2", "--speeds", "1,0.5", "--tape", str(tmp_path / "t.jsonl")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--speeds, --shards, --tape: only a Decoupled run has a virtual cluster" in result.stderr
    assert not (tmp_path / "t.jsonl").exists() and "Traceback" not in result.output


def test_unknown_codec_is_refused_by_the_parser() -> None:
    result = runner.invoke(app, ["train", "--codec", "int3"])
    assert result.exit_code == 2 and "int3" in result.output


def test_replay_of_a_missing_tape_exits_3() -> None:
    result = runner.invoke(app, ["replay", "/nonexistent/tape.jsonl"])
    assert result.exit_code == 3 and "cannot open tape" in result.stderr


def test_bench_codec_json_shape() -> None:
    result = runner.invoke(app, ["bench", "codec", "--numel", "65536", "--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["memcpy_gbps"] > 0
    assert set(data["codecs"]) == {"fp32", "bf16", "int8", "int4", "int2", "int1"}
    assert all({"encode_gbps", "decode_gbps", "rel_error"} <= set(row) for row in data["codecs"].values())


def test_bench_quality_refuses_unknown_runs() -> None:
    result = runner.invoke(app, ["bench", "quality", "--only", "bogus"])
    assert result.exit_code == 2 and "unknown runs bogus" in result.stderr
    for args, message in (
        (["--tokens", "0"], "tokens and jobs must be >= 1, got 0 and 1"),
        (["--jobs", "0"], "tokens and jobs must be >= 1, got 1000000 and 0"),  # it ran on one
        (["--preset", "nosuch"], "preset must be one of"),  # every run failed on it, then exit 1
    ):
        result = runner.invoke(app, ["bench", "quality", *args])
        assert result.exit_code == 2 and message in result.stderr, result.output


@pytest.mark.parametrize("command", [[], ["train"], ["replay"], ["bench"], ["bench", "codec"], ["bench", "quality"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_help_does_not_import_torch() -> None:
    code = "import sys, ddctl.cli.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


SIM = ["simulate", "--seeds", "1", "--days", "0.01", "--chips", "4096"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plot", "chart.txt"], "--plot chart.txt: give a file name ending in .png"),
        (["--plot", "."], "--plot .: give a file name ending in .png"),  # a folder: it wrote ..png beside it
        (["--plot", "no/such/folder/c.png"], "the folder no/such/folder does not exist"),
        (["--plot", "c.png", "--sensitivity"], "--sensitivity has no chart"),  # the chart was silently not drawn
        (["--chips", "99999999999999999999999"], "must be a whole number of chips in [1, 100,000,000]"),
        (["--days", "1e308"], "Invalid value for '--days'"),
        (["--tape-seconds", "inf"], "Invalid value for '--tape-seconds'"),
    ],
)
def test_simulate_refuses_what_it_cannot_do_before_simulating_or_writing_its_tape(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a hostile-input audit: each of these ran the simulation and wrote the tape, then ended in a traceback
    (matplotlib's, an array too big, JSON's refusal of an infinity)."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*SIM, "--tape", "t.jsonl", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # no tape, no chart


def test_json_output_is_strict_json_where_a_figure_is_not_a_number() -> None:
    """One seed has no confidence interval: the figure is NaN, which --json printed as NaN (no strict parser reads
    it); it is null now."""
    result = runner.invoke(app, [*SIM, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} in --json output"))
    assert all(system["goodput_ci95"] is None for system in data["systems"].values())
    table = runner.invoke(app, SIM)
    assert table.exit_code == 0 and re.search(r"\d\.\d ± - ", table.stdout) and "nan" not in table.stdout, table.output

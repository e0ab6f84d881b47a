"""``ddctl syncer init|token|serve`` and ``ddctl learner run``: job directories, tokens, flags, errors."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl_agents.service.auth import read_secret, verify_token
from ddctl_agents.service.server import load_job_dir

runner = CliRunner()


def test_init_writes_a_job_with_private_keys_and_tokens_verify(tmp_path: Path) -> None:
    job = tmp_path / "job"
    result = runner.invoke(app, ["syncer", "init", str(job), "--learners", "2", "--host", "10.0.0.5", "--run", "r1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"run": "r1", "job_dir": str(job), "tls": True, "learners": ["L0", "L1"]}
    for private in ("secret", "tls/ca.key", "tls/server.key"):
        assert stat.S_IMODE((job / private).stat().st_mode) == 0o600, private
    files = load_job_dir(job)
    assert files.run == "r1" and files.job.budget.learners == 2 and files.cert is not None
    token = runner.invoke(app, ["syncer", "token", str(job), "L1"]).stdout.strip()
    assert verify_token(read_secret((job / "secret").read_text()), f"Bearer {token}") == "L1"
    again = runner.invoke(app, ["syncer", "init", str(job)])
    assert again.exit_code == 2 and "already holds a job" in again.output


def test_init_rejects_bad_settings_before_writing_anything(tmp_path: Path) -> None:
    result = runner.invoke(app, ["syncer", "init", str(tmp_path / "j"), "--codec", "int3"])
    assert result.exit_code == 2 and "Invalid value for '--codec'" in result.output and "'int3'" in result.output
    assert not (tmp_path / "j").exists()


def test_serve_and_run_forward_their_flags_to_the_agents(tmp_path: Path) -> None:
    serve = runner.invoke(app, ["syncer", "serve", "--help"])
    assert serve.exit_code == 0 and "--job-dir" in serve.output and "--snapshot-every" in serve.output
    run = runner.invoke(app, ["learner", "run", "--help"])
    assert run.exit_code == 0 and "--syncer" in run.output and "--parallel-uploads" in run.output
    missing = runner.invoke(app, ["syncer", "serve", "--job-dir", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_a_broken_job_file_is_named_in_the_error(tmp_path: Path) -> None:
    job = tmp_path / "job"
    assert runner.invoke(app, ["syncer", "init", str(job), "--no-tls"]).exit_code == 0
    (job / "job.json").write_text('{"run": "x", "job": {"inner": {"preset": "gigantic"}}}')
    result = runner.invoke(app, ["syncer", "serve", "--job-dir", str(job), "--plaintext"])
    assert result.exit_code == 2 and "preset must be one of" in result.output

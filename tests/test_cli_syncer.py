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
    assert json.loads(result.stdout) == {
        "run": "r1",
        "job_dir": str(job),
        "tls": True,
        "learners": ["L0", "L1"],
        "serve": [f"ddctl syncer serve --job-dir {job}"],
    }
    assert not (job / "shards.json").exists()
    for private in ("secret", "tls/ca.key", "tls/server.key"):
        assert stat.S_IMODE((job / private).stat().st_mode) == 0o600, private
    files = load_job_dir(job)
    assert files.run == "r1" and files.job.budget.learners == 2 and files.cert is not None
    token = runner.invoke(app, ["syncer", "token", str(job), "L1"]).stdout.strip()
    assert verify_token(read_secret((job / "secret").read_text()), f"Bearer {token}") == "L1"
    again = runner.invoke(app, ["syncer", "init", str(job)])
    assert again.exit_code == 2 and "already holds a job" in again.output


def test_init_with_shards_writes_the_map_and_how_to_serve_each_shard(tmp_path: Path) -> None:
    job = tmp_path / "job"
    result = runner.invoke(app, ["syncer", "init", str(job), "--fragments", "5", "--shards", "2", "--no-tls", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    expected = {"epoch": 1, "shards": ["S0", "S1"], "owners": [0, 1, 0, 1, 0]}
    assert answer["shard_map"] == expected and json.loads((job / "shards.json").read_text()) == expected
    assert answer["serve"] == [
        f"ddctl syncer serve --job-dir {job} --shard-map {job / 'shards.json'} --shard S{i} --state-dir {job}/state-S{i}"
        for i in range(2)
    ]
    too_many = runner.invoke(app, ["syncer", "init", str(tmp_path / "j2"), "--fragments", "2", "--shards", "3"])
    assert too_many.exit_code == 2 and "shards must be in 1..2" in too_many.output
    assert not (tmp_path / "j2").exists()


def test_serve_refuses_a_shard_setup_that_cannot_work(tmp_path: Path) -> None:
    job = tmp_path / "job"
    assert runner.invoke(app, ["syncer", "init", str(job), "--fragments", "4", "--shards", "2", "--no-tls"]).exit_code == 0
    serve = ["syncer", "serve", "--job-dir", str(job), "--plaintext"]
    cases = [
        (["--shard", "S0"], "--shard-map and --shard go together"),
        (["--shard-map", str(job / "shards.json"), "--shard", "S7"], "shard 'S7' is not in the shard map"),
        (["--shard-map", str(job / "nope.json"), "--shard", "S0"], "cannot read the shard map"),
        (["--shard-map", str(job / "shards.json"), "--shard", "S0", "--eval-every", "5"], "--eval-every needs the whole model"),
        (["--shard-map", str(job / "shards.json"), "--shard", "S0", "--checkpoint-every", "60"], "--checkpoint-every needs"),
        (["--site", "us east"], "--site must be a region name of up to 64 letters, digits and _.:-, got 'us east'"),
        (["--site", "x" * 65], "--site must be a region name"),
    ]
    for extra, message in cases:
        result = runner.invoke(app, [*serve, *extra])
        assert result.exit_code == 2 and message in result.output, (extra, result.output)
    (job / "three.json").write_text(json.dumps({"epoch": 1, "shards": ["S0"], "owners": [0, 0, 0]}))
    result = runner.invoke(app, [*serve, "--shard-map", str(job / "three.json"), "--shard", "S0"])
    assert result.exit_code == 2 and "assigns 3 fragments but the job has 4" in result.output
    assert not (job / "state").exists()


def test_init_rejects_bad_settings_before_writing_anything(tmp_path: Path) -> None:
    result = runner.invoke(app, ["syncer", "init", str(tmp_path / "j"), "--codec", "int3"])
    assert result.exit_code == 2 and "Invalid value for '--codec'" in result.output and "'int3'" in result.output
    assert not (tmp_path / "j").exists()


def test_serve_and_run_forward_their_flags_to_the_agents(tmp_path: Path) -> None:
    serve = runner.invoke(app, ["syncer", "serve", "--help"])
    assert serve.exit_code == 0 and "--job-dir" in serve.output and "--snapshot-every" in serve.output
    run = runner.invoke(app, ["learner", "run", "--help"])
    assert run.exit_code == 0 and "--syncer" in run.output and "--parallel-uploads" in run.output and "--relay" in run.output
    relay = runner.invoke(app, ["syncer", "relay", "--help"])
    assert relay.exit_code == 0 and relay.output.startswith("Usage: ddctl syncer relay [OPTIONS]")
    assert "--key-file" in relay.output and "--stale-after" in relay.output
    missing = runner.invoke(app, ["syncer", "serve", "--job-dir", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_a_broken_job_file_is_named_in_the_error(tmp_path: Path) -> None:
    job = tmp_path / "job"
    assert runner.invoke(app, ["syncer", "init", str(job), "--no-tls"]).exit_code == 0
    (job / "job.json").write_text('{"run": "x", "job": {"inner": {"preset": "gigantic"}}}')
    result = runner.invoke(app, ["syncer", "serve", "--job-dir", str(job), "--plaintext"])
    assert result.exit_code == 2 and "preset must be one of" in result.output


def test_token_prints_a_regions_relay_key_and_its_learners_relay_tokens(tmp_path: Path) -> None:
    from ddctl_agents.service.auth import relay_key

    job = tmp_path / "job"
    assert runner.invoke(app, ["syncer", "init", str(job), "--learners", "2", "--no-tls"]).exit_code == 0
    secret = read_secret((job / "secret").read_text())
    key = runner.invoke(app, ["syncer", "token", str(job), "--relay", "east", "--relay-key"])
    assert key.exit_code == 0 and bytes.fromhex(key.stdout.strip()) == relay_key(secret, "east")
    token = runner.invoke(app, ["syncer", "token", str(job), "L1", "--relay", "east"]).stdout.strip()
    assert verify_token(relay_key(secret, "east"), f"Bearer {token}") == "L1"
    no_region = runner.invoke(app, ["syncer", "token", str(job), "--relay-key"])
    assert no_region.exit_code == 2 and "name the region with --relay REGION" in no_region.output
    no_identity = runner.invoke(app, ["syncer", "token", str(job)])
    assert no_identity.exit_code == 2 and "name the identity" in no_identity.output


def test_token_makes_a_regions_relay_certificate_once_signed_by_the_jobs_ca(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from ddctl_agents.relay import server_name

    job = tmp_path / "job"
    assert runner.invoke(app, ["syncer", "init", str(job), "--learners", "2"]).exit_code == 0
    made = runner.invoke(app, ["syncer", "token", str(job), "--relay", "east", "--relay-cert"])
    assert made.exit_code == 0, made.output
    cert, key = (Path(line) for line in made.stdout.split())
    assert (cert, key) == (job / "tls" / "relay-east.pem", job / "tls" / "relay-east.key") and key.stat().st_mode & 0o077 == 0
    parsed = x509.load_pem_x509_certificate(cert.read_bytes())
    ca = x509.load_pem_x509_certificate((job / "tls" / "ca.pem").read_bytes())
    parsed.verify_directly_issued_by(ca)
    sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [server_name("east")] and not sans.get_values_for_type(x509.IPAddress)
    again = runner.invoke(app, ["syncer", "token", str(job), "--relay", "east", "--relay-cert"])
    assert again.stdout == made.stdout and cert.read_bytes() == parsed.public_bytes(serialization.Encoding.PEM)  # kept
    for argv, message in (([], "name the region with --relay REGION"), (["--relay", "../x"], "identity '../x' must be")):
        refused = runner.invoke(app, ["syncer", "token", str(job), "--relay-cert", *argv])
        assert refused.exit_code == 2 and message in refused.output, refused.output
    assert sorted(p.name for p in (job / "tls").iterdir()) == [
        "ca.key",
        "ca.pem",
        "relay-east.key",
        "relay-east.pem",
        "server.key",
        "server.pem",
    ]

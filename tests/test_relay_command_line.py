"""A relay's and a relayed learner's command lines: what each refuses at start, saying what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddctl_agents.waiting import wait_until
from tests.service_harness import ENV


def run_module(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, env=ENV, timeout=120)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--region", "bad region"], "identity 'bad region' must be 1-64 characters"),
        (["--key-file", "/nonexistent/key"], "cannot read /nonexistent/key"),
        (["--stale-after", "0"], "--stale-after must be in (0, 3600] seconds, got 0.0"),
        (["--keepalive", "20"], "--keepalive (20 s) must be shorter than --stale-after (15 s)"),
        (["--plaintext", "--bind", "0.0.0.0:0"], "plaintext is refused on 0.0.0.0: it is not a loopback address"),
        (["--plaintext", "--advertise", "0.0.0.0:5"], "--advertise 0.0.0.0:5: 0.0.0.0 is not an address a learner can reach"),
        (["--plaintext", "--advertise", "east:0"], "--advertise east:0: a relay's address must be HOST:PORT with a port from"),
        ([], "give --tls-cert and --tls-key (signed by the job's CA), or --plaintext on loopback"),
    ],
)
def test_a_relay_refuses_a_bad_command_line_saying_what_is_allowed(tmp_path: Path, extra: list[str], message: str) -> None:
    key = tmp_path / "key"
    key.write_text("00" * 32)
    argv = ["--syncer", "https://127.0.0.1:9", "--region", "east", "--token", "t", "--key-file", str(key)]
    done = run_module("ddctl_agents.relay", *argv, *extra)
    assert done.returncode == 2 and message in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cadence", "2"], "--relay needs --relay-token-file, and --cadence 1: a relay serves every version"),
        ([], "--relay needs --relay-token-file"),
    ],
)
def test_a_learner_refuses_a_relay_it_cannot_use(tmp_path: Path, extra: list[str], message: str) -> None:
    token = tmp_path / "token"
    token.write_text("east.x")
    with_token = ["--relay-token-file", str(token)] if extra else []
    argv = ["--syncer", "https://127.0.0.1:9", "--name", "L0", "--token", "t", "--relay", "https://127.0.0.1:8", *with_token]
    done = run_module("ddctl_agents.agent", *argv, *extra)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_a_learner_refuses_a_malformed_relay_url_at_start(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("east.x")
    argv = ["--syncer", "https://127.0.0.1:9", "--name", "L0", "--token", "t", "--relay-token-file", str(token)]
    done = run_module("ddctl_agents.agent", *argv, "--relay", "https://[bad:1")
    assert done.returncode == 2, done.stderr
    assert "argument --relay: a relay's host must be an IP address or a DNS name, got '[bad'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--host-relay needs --host-relay-dir (the relay's token, key and certificate)"),
        (["--host-relay-dir", "/nonexistent"], "--host-relay-dir /nonexistent lacks token, key, tls.pem, tls.key"),
    ],
)
def test_a_learner_refuses_to_host_a_relay_without_its_files(extra: list[str], message: str) -> None:
    argv = ["--syncer", "https://127.0.0.1:9", "--name", "L0", "--token", "t", "--host-relay", "127.0.0.1:0", *extra]
    done = run_module("ddctl_agents.agent", *argv)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_a_hosted_relay_that_cannot_start_leaves_its_learner_to_the_shards(tmp_path: Path) -> None:
    """A relay that exits at once (here: an address it cannot bind) is logged, and its learner goes on without it."""
    folder = tmp_path / "relay"
    folder.mkdir()
    for name in ("token", "key", "tls.pem", "tls.key"):
        (folder / name).write_text("00" * 32)
    argv = ["--syncer", "https://127.0.0.1:9", "--name", "L0", "--token", "t", "--host-relay", "nonsense"]
    command = [sys.executable, "-m", "ddctl_agents.agent", *argv, "--host-relay-dir", str(folder)]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV) as learner:
        try:
            lines = learner.stderr
            assert lines is not None
            said = wait_until(lambda: (line := lines.readline()) and "the region's relay exited" in line and line,
                              timeout_s=60, what="the learner to say its relay exited")  # fmt: skip
            assert "exited (2)" in said and learner.poll() is None  # it still runs: it keeps trying the shards
        finally:
            learner.kill()


@pytest.mark.parametrize("module", ["ddctl_agents.agent", "ddctl_agents.relay"])
def test_a_malformed_syncer_url_is_refused_at_start(tmp_path: Path, module: str) -> None:
    key = tmp_path / "key"
    key.write_text("00" * 32)
    rest = ["--name", "L0"] if module == "ddctl_agents.agent" else ["--region", "east", "--key-file", str(key), "--plaintext"]
    done = run_module(module, "--syncer", "https://[bad:1", "--token", "t", *rest)
    assert done.returncode == 2, done.stderr
    assert "argument --syncer: a synchronizer's host must be an IP address or a DNS name, got '[bad'" in done.stderr
    assert "Traceback" not in done.stderr

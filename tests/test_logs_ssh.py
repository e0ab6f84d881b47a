"""``ddctl logs`` and ``ddctl ssh`` (cli/access.py, control/observe.py, control/loglines.py) on a recorded run.

The run here is only its state (instances recorded, logs on disk, nothing running), so the tests need no
machine: naming, listing, ``--since``, ``--follow`` until Ctrl-C, and the command string ``ssh`` hands to
the remote shell. tests/test_logs_ssh_docker.py does the same against Docker VMs over SSH.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import pytest
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control import observe
from ddctl.control.loglines import SinceFilter, line_time, parse_since
from ddctl.control.rundir import RunDir
from ddctl.control.state import InstanceRecord, State
from ddctl.errors import DdctlError
from ddctl.providers import deploy

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
INSTANCES = [  # name, region, role
    ("syncer", "east", "syncer"),
    ("L0", "east", "learner"),
    ("L1", "west", "learner"),
    ("L2", "west", "learner"),
    ("controller", "", "controller"),
]


def stamp(seconds_ago: float) -> str:
    return datetime.fromtimestamp(time.time() - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A recorded process run with a log per instance and nothing running (a fresh name: no process has its label)."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    name = f"logs-{uuid.uuid4().hex[:8]}"
    with State() as state:
        state.create_run(name, "regions.yaml", str(tmp_path / "job"))
        for instance, region, role in INSTANCES:
            log = RunDir(name).log(instance)
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(
                f"{stamp(3600)} ddctl_agents.x INFO {instance} an hour ago\n"
                "  a continuation of that hour-old line\n"
                f"{stamp(60)} ddctl_agents.x INFO {instance} a minute ago\n"
                "  a continuation of the recent line\n"
            )
            detail = {"log": str(log)}
            state.put_instance(InstanceRecord(name, instance, region, "process", role, "running", "", time.time(), detail))
    yield name


def logs(run: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["logs", "--run", run, *args])
    return result.exit_code, result.output


def test_without_a_name_logs_lists_regions_and_instances_and_how_to_pick(run: str) -> None:
    code, out = logs(run)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == f"run {run}: name a region or an instance, e.g. `ddctl logs east` or `ddctl logs syncer`"
    assert lines[1].split() == ["REGION", "INSTANCE", "ROLE", "STATE"]
    assert [line.split() for line in lines[2:]] == [
        ["east", "syncer", "syncer", "running"],
        ["east", "L0", "learner", "running"],
        ["west", "L1", "learner", "running"],
        ["west", "L2", "learner", "running"],
        ["-", "controller", "controller", "running"],
    ]


def test_an_unknown_name_is_a_usage_error_that_lists_the_valid_ones(run: str) -> None:
    code, out = logs(run, "north")
    assert code == 2
    assert f"run {run} has no region or instance 'north'; regions: east, west; " in out
    assert "instances: syncer, L0, L1, L2, controller" in out


def test_a_region_shows_its_agents_each_line_prefixed_with_its_instance(run: str) -> None:
    code, out = logs(run, "west")
    assert code == 0, out
    lines = out.splitlines()
    assert len(lines) == 8 and all(line.startswith(("L1 | ", "L2 | ")) for line in lines), lines
    assert "L2 |   a continuation of the recent line" in lines
    code, east = logs(run, "east")  # the syncer's region: its syncer and its learner
    assert {line.split(" | ")[0].strip() for line in east.splitlines()} == {"syncer", "L0"}


@pytest.mark.parametrize("name", ["L1", "syncer", "controller"])
def test_one_instance_by_name_is_shown_without_prefixes(run: str, name: str) -> None:
    code, out = logs(run, name)
    assert code == 0, out
    assert out.splitlines()[0].endswith(f"INFO {name} an hour ago") and " | " not in out


def test_since_keeps_recent_lines_with_their_continuations(run: str) -> None:
    code, out = logs(run, "L1", "--since", "5m")
    assert code == 0, out
    assert out.splitlines()[1:] == ["  a continuation of the recent line"]
    assert out.splitlines()[0].endswith("INFO L1 a minute ago")
    code, out = logs(run, "L1", "--since", datetime.fromtimestamp(time.time() - 7200, UTC).isoformat())
    assert code == 0 and len(out.splitlines()) == 4
    code, out = logs(run, "L1", "--since", "yesterday")
    assert code == 2 and "--since: expected a duration such as 90s, 5m or 1h" in out


def test_parse_since_reads_durations_and_iso_times() -> None:
    now = 1_000_000.0
    assert parse_since("90s", now) == now - 90
    assert parse_since("5m", now) == now - 300
    assert parse_since("1h30m", now) == now - 5400
    assert parse_since("2d", now) == now - 172800
    assert parse_since("45", now) == now - 45
    assert parse_since("2026-11-30T12:00:00Z", now) == datetime(2026, 11, 30, 12, tzinfo=UTC).timestamp()
    for bad in ("", "5 minutes", "-5m", "m"):
        with pytest.raises(DdctlError, match="--since"):
            parse_since(bad, now)


def test_line_times_in_the_agents_format_and_the_older_local_one() -> None:
    utc = datetime(2026, 11, 30, 12, 34, 56, 789000, tzinfo=UTC).timestamp()
    assert line_time("2026-11-30T12:34:56.789Z ddctl_agents.agent.progress INFO step 1/2") == pytest.approx(utc)
    local = datetime(2026, 11, 30, 12, 34, 56, 789000).timestamp()
    assert line_time("2026-11-30 12:34:56,789 ddctl_agents.agent.comm WARNING heartbeat") == pytest.approx(local)
    for unstamped in ('{"learner": "L0"}', "Traceback (most recent call last):", "2026-13-45T99:00:00Z x", ""):
        assert line_time(unstamped) is None
    keep = SinceFilter(utc)
    assert not keep("  before any stamp: its time is unknown")
    assert keep("2026-11-30T12:34:57Z x INFO new") and keep("  continued")
    assert not keep("2026-11-30T12:00:00Z x INFO old") and not keep("  continued")


def test_follow_prints_lines_once_complete_until_stopped(run: str) -> None:
    seen: queue.Queue[tuple[str, str]] = queue.Queue()
    stop = threading.Event()
    log = RunDir(run).log("L2")

    def follow() -> None:
        with State() as state:  # its own connection: SQLite's stay on their thread
            observe.follow(run, state, "L2", lambda *line: seen.put(line), None, stop.is_set)

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        assert [seen.get(timeout=10)[1] for _ in range(4)][0].endswith("L2 an hour ago")
        with log.open("a") as out:
            out.write("half a ")
            out.flush()
            time.sleep(3 * observe.POLL_S)
            assert seen.empty()  # an incomplete line waits for its end
            out.write("line\n")
        assert seen.get(timeout=10) == ("L2", "half a line")
    finally:
        stop.set()
        follower.join(10)
    assert not follower.is_alive()


def test_logs_follow_streams_new_lines_and_ctrl_c_exits_0(run: str) -> None:
    # Ctrl-C reaches it even from a suite started in the background: see conftest.pytest_configure
    command = [sys.executable, "-c", "from ddctl.cli.app import main; main()", "logs", "--run", run, "west", "--follow"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=os.environ)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in proc.stdout or []], daemon=True).start()
    try:
        first = [lines.get(timeout=30) for _ in range(8)]
        assert {line.split(" | ")[0].strip() for line in first} == {"L1", "L2"}
        with RunDir(run).log("L1").open("a") as out:
            out.write(f"{stamp(0)} ddctl_agents.agent.progress INFO step 7/9\n")
        new = lines.get(timeout=10)
        assert new.startswith("L1 | ") and new.endswith("ddctl_agents.agent.progress INFO step 7/9"), new
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "interrupted" not in err and "Traceback" not in err, err


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """What ``ddctl ssh`` would run: (name, --instance, the remote command string); nothing is reached."""
    calls: list[tuple[str, str, str]] = []
    picked: list[tuple[str, str]] = []
    target = deploy.Target("203.0.113.7", "ssh-ed25519 AAAA", Path("/nonexistent"))

    def fake_target(run: str, state: State, name: str, instance: str = "") -> tuple[deploy.Target, Path]:
        picked.append((name, instance))
        return target, Path("/nonexistent")

    def fake_relay(where: deploy.Target, command: str, out: BinaryIO, err: BinaryIO, wait_s: float = 10.0) -> int:
        calls.append((*picked[-1], command))
        out.write(f"ran {command}\n".encode())
        return 0

    monkeypatch.setattr(observe, "ssh_target", fake_target)
    monkeypatch.setattr(deploy, "relay_command", fake_relay)
    return calls


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["eu-west", "--", "ls -la ~; ps aux"], ("eu-west", "", "ls -la ~; ps aux")),  # one word: the remote shell splits it
        (["eu-west", "ls", "-la"], ("eu-west", "", "ls -la")),  # words after the name are the command, options too
        (["syncer", "echo", "a  b", "$HOME"], ("syncer", "", "echo a  b $HOME")),  # joined by spaces, never quoted
        (["--instance", "L2", "west", "true"], ("west", "L2", "true")),  # ddctl's options come before the name
        (["west", "--instance", "L2"], ("west", "", "--instance L2")),  # ... as with `ssh host -p 22`: a command
        (["L1", "--", "tail", "--", "-x"], ("L1", "", "tail -- -x")),  # only the first `--` is ddctl's
    ],
)
def test_ssh_passes_its_command_as_openssh_does(
    run: str, sent: list[tuple[str, str, str]], args: list[str], expected: tuple[str, str, str]
) -> None:
    result = runner.invoke(app, ["ssh", "--run", run, *args])
    assert result.exit_code == 0, result.output
    assert sent == [expected] and result.stdout == f"ran {expected[2]}\n"


def test_the_command_string_runs_as_a_shell_runs_it() -> None:
    """What the remote sshd does with the string (``$SHELL -c``), here: both commands run, ``~`` expands."""
    command = deploy.openssh_command(["echo one; echo", "two ~"])
    assert command == "echo one; echo two ~"
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True, env={"HOME": "/home/x"})
    assert done.stdout == "one\ntwo /home/x\n"


def test_ssh_without_a_name_lists_and_an_unknown_name_lists_the_valid_ones(run: str) -> None:
    listed = runner.invoke(app, ["ssh", "--run", run])
    assert listed.exit_code == 0, listed.output
    assert listed.output.startswith(f"run {run}: name a region or an instance, e.g. `ddctl ssh east` or `ddctl ssh syncer`")
    unknown = runner.invoke(app, ["ssh", "--run", run, "north", "true"])
    assert unknown.exit_code == 2 and "has no region or instance 'north'; regions: east, west" in unknown.output
    wrong = runner.invoke(app, ["ssh", "--run", run, "--instance", "L9", "west", "true"])
    assert wrong.exit_code == 2 and f"region west of {run} has no instance 'L9'" in wrong.output
    down = runner.invoke(app, ["ssh", "--run", run, "syncer", "true"])  # recorded, but nothing runs
    assert down.exit_code == 2 and "no instance of syncer is running right now" in down.output

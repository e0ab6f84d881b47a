"""``ddctl ssh`` and ``ddctl logs --follow`` against a live Docker run: real sshd, real shells, agent logs over SSH.

One region with its syncer and one learner, the cheapest Docker run. Needs a Docker engine (`.ci/run` or
`scripts/docker-engine` starts one); skipped otherwise, like tests/test_up_docker.py.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control.loglines import line_time
from ddctl.providers import linkshape
from ddctl.providers.base import RUN_LABEL
from ddctl.providers.docker.engine import Engine, engine_unavailable
from tests.builders import dry_run_up

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}"),
    pytest.mark.skipif(linkshape.available() is not None, reason=f"{linkshape.available()}"),
]
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
PROGRESS = re.compile(r"^L0 +\| (\S+) ddctl_agents\.agent\.progress INFO step \d+/\d+")


def ssh(run: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["ssh", "--run", run, *args])
    return result.exit_code, result.output


def test_ssh_runs_commands_as_openssh_would_and_logs_follow_the_vms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    regions = {
        "run": "shells",
        "syncer": "solo",
        "training": {"preset": "tiny", "tokens": 4_000_000, "fragments": 2, "inner_steps": 8, "max_bytes": 1 << 20},
        "regions": [{"name": "solo", "provider": "docker", "learners": 1}],
    }
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(regions))
    run = dry_run_up(path)["run"]
    try:
        # the command is one string for the remote shell: `;`, `~` and `$((...))` are the shell's
        code, out = ssh(run, "solo", "--", "ls -la ~; echo $((6 * 7))")
        assert code == 0 and out.splitlines()[0].startswith("total") and out.splitlines()[-1] == "42", out
        assert ssh(run, "solo", "echo", "hello", "world") == (0, "hello world\n")
        assert ssh(run, "solo", "--", "exit 3")[0] == 3
        # the syncer's machine by its name; a region's name reaches its learner
        which = "tr '\\0' ' ' </proc/$(cat /opt/ddctl/agent.pid)/cmdline"
        code, out = ssh(run, "syncer", "--", which)
        assert code == 0 and "ddctl_agents.service" in out, out
        code, out = ssh(run, "solo", "--", which)
        assert code == 0 and "ddctl_agents.agent" in out and "--name L0" in out, out

        # a running VM's log, as it grows, over SSH; Ctrl-C stops the following, not the run
        started = time.time()
        command = [sys.executable, "-c", "from ddctl.cli.app import main; main()", "logs", "--run", run, "solo", "-f"]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=os.environ)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in proc.stdout or []], daemon=True).start()
        try:
            seen: list[str] = []
            deadline, fresh = time.monotonic() + 60, False
            while time.monotonic() < deadline and not fresh:  # a progress line written after we started following
                try:
                    seen.append(lines.get(timeout=1.0))
                except queue.Empty:
                    continue
                found = PROGRESS.match(seen[-1])
                fresh = bool(found and (line_time(found.group(1)) or 0) > started)
            assert fresh, f"no new progress line within 60 s: {seen[-10:]}"
            assert any(line.startswith("syncer | ") for line in seen), seen[:10]
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "Traceback" not in err, err
        with Engine() as engine:
            states = {c["Labels"]["ddctl-name"]: c["State"] for c in engine.containers({RUN_LABEL: run})}
        assert states == {"syncer": "running", "L0": "running"}

        recent = runner.invoke(app, ["logs", "--run", run, "syncer", "--since", "30s"])
        assert recent.exit_code == 0 and " | " not in recent.output, recent.output
        stamps = [t for t in map(line_time, recent.output.splitlines()) if t is not None]
        assert stamps and min(stamps) >= time.time() - 60, recent.output
    finally:
        down = runner.invoke(app, ["down", "--run", run])
    assert down.exit_code == 0, down.output

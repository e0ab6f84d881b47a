"""``ddctl status --watch`` in a real pseudo-terminal against a running dry run, read back with a terminal emulator."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import struct
import sys
import termios
from pathlib import Path
from typing import Any

import pyte
import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl_agents.waiting import wait_until
from tests.builders import dry_run_up

runner = CliRunner()
COLUMNS, ROWS = 100, 30
REGIONS = {
    "run": "tty",
    "syncer": "east",
    "training": {"preset": "tiny", "tokens": 20_000_000, "fragments": 4, "inner_steps": 8, "max_bytes": 1 << 21},
    "regions": [
        {"name": "east", "provider": "process", "learners": 1},
        {"name": "west", "provider": "process", "learners": 2},
    ],
}


def _spawn(argv: list[str]) -> tuple[int, int]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of a known size, then ddctl
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        os.environ["TERM"] = "xterm-256color"
        os.execv(argv[0], argv)
    return pid, fd


def _read_until(fd: int, stream: pyte.ByteStream, screen: pyte.Screen, done: Any, timeout_s: float) -> str:
    """Feed the terminal's output to the screen until ``done(text)``; the screen as it is at the timeout."""

    def drawn() -> str | None:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            with contextlib.suppress(OSError):  # the child closed the terminal
                stream.feed(os.read(fd, 65536))
        text = "\n".join(screen.display)
        return text if done(text) else None

    try:
        return wait_until(drawn, timeout_s=timeout_s, every_s=0, what="the screen")
    except TimeoutError:
        return "\n".join(screen.display)


@pytest.mark.slow
def test_status_watch_draws_the_run_and_ctrl_c_leaves_it_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(REGIONS))
    run = dry_run_up(path)["run"]
    ddctl = shutil.which("ddctl", path=str(Path(sys.executable).parent))
    assert ddctl, "the ddctl entry point is installed beside this interpreter"
    pid = fd = -1
    try:
        pid, fd = _spawn([ddctl, "status", "--watch", "--run", run])
        screen = pyte.Screen(COLUMNS, ROWS)
        stream = pyte.ByteStream(screen)

        def drawn(text: str) -> bool:
            return run in text and "syncer ok" in text and text.count("training") >= 3 and "events" in text

        text = _read_until(fd, stream, screen, drawn, 60)
        assert drawn(text), text
        rounds_before = json.loads(runner.invoke(app, ["status", "--json", "--run", run]).stdout)["rounds"]
        os.write(fd, b"\x03")  # Ctrl-C, through the terminal's line discipline

        def exited() -> tuple[int, int] | None:
            found = os.waitpid(pid, os.WNOHANG)
            if found[0] == pid:
                return found
            _read_until(fd, stream, screen, lambda _t: False, 0.2)
            return None

        with_status = wait_until(exited, timeout_s=15, every_s=0, what="status --watch to stop on Ctrl-C")
        pid = -1
        assert os.waitstatus_to_exitcode(with_status[1]) == 0

        def kept_training() -> dict[str, Any] | None:  # up returned on the first round: a learner may still register
            after = json.loads(runner.invoke(app, ["status", "--json", "--run", run]).stdout)
            states = {learner["state"] for region in after["regions"] for learner in region["learners"]}
            assert states <= {"deploying", "training"}, after["regions"]
            return after if after["rounds"] > rounds_before and states == {"training"} else None

        wait_until(kept_training, timeout_s=60, every_s=0.5, what="the run to keep training with every learner")
    finally:
        if pid > 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if fd >= 0:
            os.close(fd)
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output

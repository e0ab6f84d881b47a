"""A VM's last words: what it writes on its serial console before powering off, read back after it is gone.

A spot VM terminates when its OS shuts down, and its disk goes with it. EC2
keeps the serial console's output after termination (``GetConsoleOutput``), so
the power-off hook writes the agent's exit summary and exit code there, each
as one ``ddctl-file PATH BASE64`` line, then the tail of its log as text: the
controller still learns why a learner ended (finished, notice, dead-man) and
``down`` still collects its log.
"""

from __future__ import annotations

import base64
import binascii

from ddctl.providers.deploy import REMOTE_ROOT

MARK = "ddctl-file"
LAST_FILES = (f"{REMOTE_ROOT}/summary.json", f"{REMOTE_ROOT}/state/summary.json", f"{REMOTE_ROOT}/agent.exit")
LOG_LINES = 200


def power_off_hook() -> str:
    """The script the agent's exit runs: its last words on the console, then off for good."""
    files = " ".join(LAST_FILES)
    return (
        "#!/bin/sh\n"
        "# the VM's last words on its serial console (EC2 keeps it after termination), then off for good\n"
        f'{{ for f in {files}; do [ -f "$f" ] && echo "{MARK} $f $(base64 -w0 "$f")"; done; '
        f"tail -n {LOG_LINES} {REMOTE_ROOT}/agent.log; }} >/dev/console 2>&1\n"
        "exec shutdown -h now\n"
    )


def last_files(console: str) -> dict[str, bytes]:
    """The files a console's ``ddctl-file`` lines carry (the last copy of each wins); malformed lines are skipped."""
    found: dict[str, bytes] = {}
    for line in console.splitlines():
        parts = line.strip().split(" ")
        if len(parts) == 3 and parts[0] == MARK:
            try:
                found[parts[1]] = base64.b64decode(parts[2], validate=True)
            except (binascii.Error, ValueError):
                continue
    return found


def log_text(console: str) -> str:
    """The console without the file lines: the log's tail as the VM printed it."""
    return "".join(line for line in console.splitlines(keepends=True) if not line.startswith(MARK))

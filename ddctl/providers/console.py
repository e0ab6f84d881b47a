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
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from ddctl.errors import DdctlError
from ddctl.providers import deploy
from ddctl.providers.deploy import REMOTE_ROOT

MARK = "ddctl-file"
LAST_FILES = (f"{REMOTE_ROOT}/summary.json", f"{REMOTE_ROOT}/state/summary.json", f"{REMOTE_ROOT}/agent.exit")
LOG_LINES = 200
SUMMARIES = frozenset(PurePosixPath(f).name for f in LAST_FILES)
"""Files read as a learner's or the syncer's last words: small, whatever the VM claims."""


def limit_of(path: str, given: int | None = None) -> int:
    """How many bytes of ``path`` are read from a VM: ``given`` where the caller knows (``ddctl pull``: its manifest's
    count), else an exit summary a MiB and anything else (a tape, a checkpoint's file) ``deploy.FILE_LIMIT``."""
    if given is not None:
        return given
    return deploy.SUMMARY_LIMIT if PurePosixPath(path).name in SUMMARIES else deploy.FILE_LIMIT


def log_command(limit: int = deploy.LOG_LIMIT) -> str:
    """The remote command that prints the agent's log, its last ``limit`` bytes where it is longer."""
    return f"tail -c {limit} {REMOTE_ROOT}/agent.log"


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


def read_file(
    ssh_target: Callable[[], deploy.Target], console: Callable[[], str], path: str, limit: int | None = None
) -> bytes | None:
    """A file of a running VM (over SSH), or of an ended one from its last words on the console; None if neither has it.
    One larger than ``limit`` (None: ``limit_of(path)``) is ``deploy.TooLarge``: the VM answered, with too much."""
    most = limit_of(path, limit)
    try:
        return deploy.read_bytes(ssh_target(), path, limit=most)  # bytes as they are: a summary, or tensors
    except deploy.TooLarge:
        raise
    except DdctlError:
        kept = last_files(console()).get(path)
        return None if kept is None else deploy.within(kept, "console", path, most)


def collect_log(ssh_target: Callable[[], deploy.Target], console: Callable[[], str], log: Path, provider_id: str) -> None:
    """Append the agent's log to ``log``: all of it (its last ``deploy.LOG_LIMIT`` bytes) over SSH while the VM answers,
    else the tail its console kept."""
    try:
        _, text, _ = deploy.run_command(ssh_target(), log_command(), wait_s=5.0, limit=deploy.LOG_LIMIT)
        where = provider_id
    except DdctlError:
        text, where = log_text(console()), f"console of {provider_id}"
    if text:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            out.write(f"==> {where} <==\n{text}".encode())

"""How one learner becomes its ranks: the agent runs itself again under torchrun.

``--gpus N`` runs N ranks on this machine (one per GPU, or N CPU ranks with
gloo where there is none). ``--nodes K --rendezvous HOST:PORT`` spans K
machines of one region: the same command on each, meeting at torchrun's c10d
rendezvous on HOST (one of them, over the region's private network). Whichever
process torchrun makes global rank 0 is the leader that talks to the
synchronizer; the rest only train.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

import torch

from ddctl_agents.errors import AgentError

LAUNCH_FLAGS = ("--gpus", "--nodes", "--rendezvous")
"""Flags torchrun consumes: each rank runs the command line without them."""

EXIT_FILE_ENV = "DDCTL_RANK0_EXIT_FILE"
"""Where rank 0 writes its exit code for the launching process."""

_ENDPOINT = re.compile(r"[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}")


def rank_argv(argv: list[str]) -> list[str]:
    """The command line minus the launch flags (``--gpus 2`` and ``--gpus=2`` alike): what each rank runs."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCH_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in LAUNCH_FLAGS)):
            out.append(arg)
    return out


def own_address(rendezvous: str, syncer_url: str) -> str:
    """This machine's address on the route to the rendezvous host (to the syncer on the host itself); "" if unknown.

    torchrun tells every node to meet rank 0's node at that node's address, which by default is its
    hostname: not always a name the region's other machines resolve. A UDP connect sends nothing."""
    host = rendezvous.rpartition(":")[0]
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            host = urllib.parse.urlsplit(syncer_url).hostname or ""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
    except (OSError, UnicodeError):
        return ""


def torchrun_command(gpus: int, nodes: int, rendezvous: str, run_id: str, argv: list[str], local_addr: str = "") -> list[str]:
    """The torchrun command line for this learner's ranks, or AgentError naming what is wrong.

    ``local_addr``: where the other nodes reach this one (``own_address``); "" lets torchrun use the hostname."""
    if not 1 <= gpus <= 64:
        raise AgentError(f"--gpus must be in [1, 64], got {gpus}")
    if not 1 <= nodes <= 64:
        raise AgentError(f"--nodes must be in [1, 64], got {nodes}")
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}", "--max-restarts=0"]
    if nodes == 1:
        command.append("--standalone")
    else:
        if not _ENDPOINT.fullmatch(rendezvous) or not 0 < int(rendezvous.rpartition(":")[2]) < 65536:
            raise AgentError(f"--nodes {nodes} needs --rendezvous HOST:PORT (one of the nodes), got {rendezvous!r}")
        command += [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous}", f"--rdzv-id={run_id}"]
        command += [f"--local-addr={local_addr}"] if local_addr else []
    return [*command, "-m", "ddctl_agents.agent", *rank_argv(argv)]


def run_ranks(gpus: int, nodes: int, rendezvous: str, run_id: str, device: str, argv: list[str], local_addr: str = "") -> int:
    """Check the machine has the GPUs asked for, run torchrun, and return the learner's exit code.

    This process stays (its pid is the learner's, for whoever tracks it) and passes
    SIGTERM and SIGINT straight to the ranks: they stop together on the leader's
    decision and exit 0. Signalled itself, torchrun would kill them and exit 1.
    """
    command = torchrun_command(gpus, nodes, rendezvous, run_id, argv, local_addr)
    available = torch.cuda.device_count() if device != "cpu" and torch.cuda.is_available() else 0
    if available and gpus > available:
        raise AgentError(f"--gpus {gpus}, but this machine has {available} GPUs")
    if device == "cuda" and not available:
        raise AgentError("--device cuda, but torch sees no CUDA device")
    with tempfile.TemporaryDirectory(prefix="ddctl-ranks-") as folder:
        exit_file = Path(folder) / "exit"
        child = subprocess.Popen(command, env={**os.environ, EXIT_FILE_ENV: str(exit_file)})
        _forward_signals(child)
        code = child.wait()
        try:
            leader = int(exit_file.read_text())
        except (OSError, ValueError):  # rank 0 ran on another node, or died before it could say
            leader = 0
    return leader if code != 0 and leader != 0 else code  # torchrun says 1 for any failure; the leader says why


def report_exit(code: int) -> None:
    """Rank 0 under ``run_ranks``: leave the exit code where the launcher reads it."""
    path = os.environ.get(EXIT_FILE_ENV)
    if path and os.environ.get("RANK") == "0":
        with contextlib.suppress(OSError):
            Path(path).write_text(str(code))


def _forward_signals(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM and SIGINT go to torchrun's ranks (to torchrun itself where /proc cannot tell them)."""

    def forward(signum: int, _frame: object) -> None:
        for pid in _children(child.pid) or [child.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (torchrun's ranks), from /proc; empty where it cannot tell."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for task in tasks for c in (task / "children").read_text().split()]
    except OSError:
        return []


def end_rank(code: int) -> None:
    """A rank under torchrun ends here, its output flushed, without the interpreter's teardown: there, torch's C++
    threads met static destructors and a rank that had finished cleanly aborted ("terminate called without an active
    exception", twice in CI runs of test_model_contract), failing the learner it belonged to."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = [
    "EXIT_FILE_ENV",
    "LAUNCH_FLAGS",
    "end_rank",
    "own_address",
    "rank_argv",
    "report_exit",
    "run_ranks",
    "torchrun_command",
]

"""A learner's relay options: it may be behind its region's relay (``--relay``), and one learner of the region hosts
it (``--host-relay``).

``ddctl up`` gives a region with a relay no machine of its own for it: the
region's first learner runs it as a child process, on its machine, and the
region's learners (that one too) reach it at that machine's address. The relay
lives and dies with its host (Linux ends it with its parent, even after a
``kill -9``); a learner whose relay is gone takes its versions from the shards
directly (``agent/subscription.py``), so a relay is never what a run waits on.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from ddctl_agents import relay
from ddctl_agents.errors import AgentError

log = logging.getLogger(__name__)
HOST_FILES = ("token", "key", "tls.pem", "tls.key")
"""What ``--host-relay-dir`` holds: the relay's token for the shards, the region's relay key (hex), its certificate
and the certificate's key (``relay/serve.py``)."""
PR_SET_PDEATHSIG = 1


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--relay", default="", type=_relay_url, help="The region's relay URL: versions come through it (cadence 1 only)."
    )
    parser.add_argument("--relay-token-file", type=Path, help="A file holding this learner's token for the relay.")
    parser.add_argument(
        "--host-relay", default="", metavar="HOST:PORT", help="Also run the region's relay here (it ends with this learner)."
    )
    parser.add_argument("--host-relay-dir", type=Path, metavar="DIR", help=f"The hosted relay's files: {', '.join(HOST_FILES)}.")


def _relay_url(text: str) -> str:
    """Checked when the learner starts, with what is allowed, not in its stream's thread at the first connection."""
    try:
        return relay.url(text) if text else ""
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def relay_argv(args: argparse.Namespace) -> list[str]:
    """The hosted relay's command line: the learner's shards, region and CA, the files of ``--host-relay-dir``."""
    folder: Path | None = args.host_relay_dir
    if folder is None:
        raise AgentError("--host-relay needs --host-relay-dir (the relay's token, key and certificate)")
    missing = [name for name in HOST_FILES if not (folder / name).is_file()]
    if missing:
        raise AgentError(f"--host-relay-dir {folder} lacks {', '.join(missing)}; it must hold {', '.join(HOST_FILES)}")
    argv = [sys.executable, "-m", "ddctl_agents.relay", *(f"--syncer={url}" for url in args.syncer), "--region", args.region]
    argv += ["--token-file", str(folder / "token"), "--key-file", str(folder / "key"), "--bind", args.host_relay]
    argv += ["--tls-cert", str(folder / "tls.pem"), "--tls-key", str(folder / "tls.key")]
    return argv + (["--ca", str(args.ca)] if args.ca else [])


@contextlib.contextmanager
def hosted(args: argparse.Namespace) -> Iterator[None]:
    """Run the region's relay beside this learner while the block runs (not in torchrun's ranks: their launcher hosts
    it). A relay that exits early is logged; the learner goes on without it."""
    if not args.host_relay or "WORLD_SIZE" in os.environ:
        yield
        return
    child = subprocess.Popen(relay_argv(args), preexec_fn=_end_with_parent)  # its lines go to this learner's log
    ending = threading.Event()

    def watch() -> None:
        code = child.wait()
        if not ending.is_set():
            log.warning("the region's relay exited (%s); this region's learners take versions from the shards", code)

    threading.Thread(target=watch, name="relay-host", daemon=True).start()
    log.info("hosting the region's relay at %s (pid %d)", args.host_relay, child.pid)
    try:
        yield
    finally:
        ending.set()
        child.terminate()
        try:
            child.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _end_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGTERM when this learner ends, however it ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

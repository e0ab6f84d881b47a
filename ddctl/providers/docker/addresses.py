"""A learner VM's address on its region network: one never handed before in the run, as a cloud gives a new VM.

Docker's own allocator hands the lowest free address, so a replaced VM came back
at the address of the one it replaced, and nothing that must follow a machine to
a new address (a region's relay: ``agent/subscription.py``) was ever exercised
by a dry run. Here each address is handed once per run (the file
``RunDir.docker_addresses``, under a lock: ``up`` and the controller may create
at once), lowest first; once every one in the range has been handed, a free one
is reused.
"""

from __future__ import annotations

import fcntl
import ipaddress
from collections.abc import Iterable
from pathlib import Path

from ddctl.errors import ProvisionError

LEARNER_HOSTS = range(2, 128)
"""Learners' addresses on a region's /24 (the network's ip range, .0/25; .1 is its gateway, the syncers' are .250 down)."""


def fresh_address(subnet: ipaddress.IPv4Network, in_use: Iterable[str], handed_file: Path) -> str:
    """The lowest learner address of ``subnet`` that this run never handed and no container holds, recorded as
    handed; where each was handed once, the lowest that no container holds."""
    handed_file.parent.mkdir(parents=True, exist_ok=True)
    with handed_file.open("a+") as handed:
        fcntl.flock(handed, fcntl.LOCK_EX)  # released when the file closes
        handed.seek(0)
        taken = set(in_use)
        candidates = [str(subnet[host]) for host in LEARNER_HOSTS if str(subnet[host]) not in taken]
        if not candidates:
            raise ProvisionError(
                f"every learner address of {subnet} (.{LEARNER_HOSTS[0]}-.{LEARNER_HOSTS[-1]}) is in use",
                kind="quota",
                scope="cloud",
                provider="docker",
            )
        before = set(handed.read().split())
        chosen = next((a for a in candidates if a not in before), candidates[0])
        handed.write(chosen + "\n")
        handed.flush()
        return chosen

"""What the syncer's core asks its shell to do, and what it tells a learner about an update.

The core never performs I/O: it returns these values and the shell (virtual
cluster, replay, the HTTP/2 service) carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddctl_agents.core.messages import FragmentVersion


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """Deliver ``message`` to each learner in ``to``."""

    to: tuple[str, ...]
    message: FragmentVersion
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One entry for the event tape."""

    entry: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """An unexpected error in one fragment's round; the shell logs it with its traceback.

    The core catches it so that one fragment's bug never stops the other fragments' rounds."""

    fragment: int
    reason: str
    error: BaseException


Effect = Send | Record | Fault


ACK_STATUSES = ("accepted", "late", "dropped", "duplicate", "rejected")
"""What a synchronizer may say of an update: a learner counts its tokens by these and nothing else."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """What the learner is told about its update."""

    status: str  # one of ACK_STATUSES
    reason: str
    version: int
    code: str = ""
    """For ``rejected``: the refusal's code, a key of errors.REJECTIONS."""

"""Which history of versions this synchronizer serves: an id kept in its state directory.

Version numbers mean something only within one history. A syncer that recovers
from its state directory continues its history (same id, versions only grow);
one whose state is gone (its VM replaced with a fresh disk, a new state
directory) starts another one from its initial model or resume checkpoint, and
numbers its versions from there. Each fragment stream names the history in its
``x-ddctl-history`` header, so a learner that held versions of the old one
learns they will never be continued (``agent/subscription.py``) and starts over
from the new one, where otherwise every update it sent would be refused as based
on a version this syncer never produced. A learner names the history its versions
count in on each update too: one based on a version of another history is refused
(``check``) even where its number is one the new history also has, since the
content under that number is not the same.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from ddctl_agents.errors import BadRequest, ImpossibleVersion

FILE = "history"
HEADER = b"x-ddctl-history"
LISTED = b"x-ddctl-shard-histories"
"""A relay's streams: each shard's history by its URL (``URL=ID,URL=ID``), so its learners name them (and see one
start over) as if they read the shards themselves; a relay names no history of its own."""
_ID = re.compile(r"[0-9a-f]{16}")


def of(state_dir: Path) -> str:
    """The id of the history ``state_dir`` holds (made if it is new): read, or made durable before any version is served."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / FILE
    if path.is_file():
        held = path.read_text(errors="replace").strip()
        if _ID.fullmatch(held):
            return held
    made = secrets.token_hex(8)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as out:
        out.write(made + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    descriptor = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return made


def valid(text: str) -> bool:
    """Whether ``text`` (a header another process sent) is a history id: 16 lowercase hex digits."""
    return bool(_ID.fullmatch(text))


def changed(known: dict[str, str], source: str, said: str) -> str:
    """The history ``source`` named before (``known``, where the first it names is kept), where ``said`` (what it
    names now) is another; "" when it is the same, the first, or not a history at all (an older syncer names none)."""
    if not valid(said):
        return ""
    before = known.setdefault(source, said)
    return before if before != said else ""


def check(said: str | None, own: str, what: str = "update") -> None:
    """Refuse an update (or heartbeat: ``what``) whose header names another history than ``own`` (the versions its
    sender holds are not this syncer's); one that names none (an older learner, or one whose stream has not opened
    yet) is taken as before."""
    if said is None:
        return
    if not valid(said):
        raise BadRequest(f"header {HEADER.decode()} must be a history id (16 lowercase hex digits), got {said!r:.40}")
    if said != own:
        raise ImpossibleVersion(f"the {what}'s sender holds versions of history {said}, this synchronizer's count in "
                                f"{own}: it started over and will never continue them")  # fmt: skip


def listing(histories: dict[str, str]) -> str:
    """The ``LISTED`` header for these shards' histories (by URL)."""
    return ",".join(f"{url}={said}" for url, said in histories.items() if valid(said))


def listed(text: str, urls: list[str]) -> dict[str, str]:
    """The histories a relay's ``LISTED`` header names for the shards at ``urls`` (the ones this learner sends to);
    anything else in it (another URL, an id that is not one, more entries than shards) is left out."""
    if len(text) > len(urls) * 2048:  # longer than that many entries can be
        return {}
    out: dict[str, str] = {}
    for entry in text.split(",")[: len(urls)]:
        url, _, said = entry.rpartition("=")
        if url in urls and valid(said):
            out[url] = said
    return out

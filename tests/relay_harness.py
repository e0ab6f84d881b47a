"""What the relay's tests share: a version frame, a fake shard's stream, a learner's byte counter, and a job's
synchronizer with region east's relay and synthetic learners as real processes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from prometheus_client.parser import text_string_to_metric_families

from ddctl.local.relay import LocalRelay
from ddctl.local.service import LocalSyncer, tiny_job
from ddctl_agents.agent.client import Unavailable
from ddctl_agents.agent.subscription import Subscriber
from ddctl_agents.core.messages import FragmentVersion, encode_fragment
from ddctl_agents.waiting import wait_until
from tests.service_harness import ENV


def version_frame(fragment: int, version: int) -> bytes:
    message = FragmentVersion(fragment=fragment, version=version, tensors={"w": torch.full((4,), float(version))})
    return encode_fragment(message, "fp32", 64)


class FakeShard:
    """A shard's stream (or a relay's): these frames, then (if ``hold``) a wait until it is set, then (if ``breaks``) a
    broken connection. ``on_open`` sees the fake as each stream opens, before it is counted in ``asked``: it may change
    what this stream sends, or raise as a refused stream does."""

    def __init__(
        self,
        frames: list[bytes],
        breaks: bool = False,
        located: str = "",
        history: str = "",
        on_open: Callable[[FakeShard], None] | None = None,
        hold: threading.Event | None = None,
    ) -> None:
        self.frames, self.breaks, self.located, self.history = frames, breaks, located, history
        self.on_open, self.hold = on_open, hold
        self.listed = ""
        """As a relay: its shards' histories (``history.LISTED``)."""
        self.asked: list[list[int]] = []

    def relay_address(self) -> str:
        """Where this shard says the region's relay is ("": none streams from it)."""
        return self.located

    def fragments(
        self,
        since: list[int],
        chain: list[str] | None = None,
        at: str = "",
        opened: Callable[[str], None] | None = None,
        listed: Callable[[str], None] | None = None,
    ) -> Iterator[bytes]:
        if self.on_open is not None:
            self.on_open(self)
        self.asked.append(list(since))
        if opened is not None:
            opened(self.history)
        if listed is not None:
            listed(self.listed)
        yield from self.frames
        self.frames = []
        if self.hold is not None:
            self.hold.wait(10)
        if self.breaks:
            raise Unavailable("the connection broke")

    def close(self) -> None:
        pass


def flaky_shard(frames: list[bytes], failures: int) -> FakeShard:
    """A shard that refuses its stream ``failures`` times, then sends its frames."""
    left = [failures]

    def refuse(shard: FakeShard) -> None:
        if left[0]:
            left[0] -= 1
            raise Unavailable("connection refused")

    return FakeShard(frames, on_open=refuse)


class Counter:
    def __init__(self) -> None:
        self.down = 0

    def came_down(self, nbytes: int) -> None:
        self.down += nbytes


def subscribed_until(subscriber: Subscriber, versions: list[int], what: str) -> None:
    """``subscriber``'s threads (one shard, and its relay) run from no versions until it holds ``versions``."""
    subscriber.versions = [-1] * len(versions)
    threads = [threading.Thread(target=target, daemon=True) for _, target in subscriber.loops(["https://s0"])]
    for thread in threads:
        thread.start()
    wait_until(lambda: subscriber.versions == versions, timeout_s=10, what=what)
    subscriber.stopping.set()
    for thread in threads:
        thread.join(timeout=10)


def start_learner(
    syncer: LocalSyncer, root: Path, name: str, region: str, relay: LocalRelay | None, step_s: float, relay_url: str = ""
) -> subprocess.Popen[bytes]:
    """A synthetic learner; behind ``relay``, which it dials at ``relay_url`` where one is given."""
    argv = [sys.executable, "-m", "ddctl_agents.agent", "--syncer", syncer.url, "--name", name, "--token", syncer.token(name),
            "--ca", str(syncer.ca), "--summary", str(root / f"{name}.json"), "--region", region]  # fmt: skip
    argv += ["--synthetic-step", str(step_s)]
    if relay is not None:
        argv += ["--relay", relay_url or relay.url, "--relay-token-file", str(relay.learner_token_file(name))]
    with (root / f"{name}.log").open("ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=log, env=ENV)


def finished(procs: dict[str, subprocess.Popen[bytes]], root: Path) -> dict[str, dict[str, Any]]:
    for name, proc in procs.items():
        code = proc.wait(timeout=300)
        assert code == 0, (root / f"{name}.log").read_text()[-3000:]
    return {name: json.loads((root / f"{name}.json").read_text()) for name in procs}


def relay_metrics(syncer: LocalSyncer) -> dict[str, float]:
    """Region east's relay families on the synchronizer's ``/metrics``."""
    client = syncer.client()
    try:
        text = client.metrics()
    finally:
        client.close()
    return {
        f.name: sample.value
        for f in text_string_to_metric_families(text)
        if f.name.startswith("ddctl_relay_")
        for sample in f.samples
        if sample.labels.get("region") == "east" and not sample.name.endswith("_created")
    }


def status_of(syncer: LocalSyncer) -> dict[str, Any]:
    client = syncer.client()
    try:
        return client.status()
    finally:
        client.close()


@contextlib.contextmanager
def relayed(tmp_path: Path, learners: int, tokens: int, *relay_flags: str) -> Iterator[tuple[LocalSyncer, LocalRelay]]:
    """A job's synchronizer and region east's relay, both serving until the block ends."""
    with LocalSyncer(tmp_path, tiny_job(learners=learners, tokens=tokens, inner_steps=4), run="relay") as syncer:
        syncer.start()
        relay = LocalRelay(syncer, "east").start(*relay_flags)
        try:
            # it holds the bootstrap versions before a learner asks: on a loaded machine a relay still waiting for them
            # passed the learners' 5 s for its first answer, and they pulled the bootstrap from the shards too
            wait_until(lambda: relay.health()["frames_in"] > 0, timeout_s=60, what="the relay to hold the first versions")
            yield syncer, relay
        finally:
            relay.stop()

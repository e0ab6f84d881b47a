"""`ddctl replay TAPE`: re-run a recorded run from its tape and check it matches.

The tape fixes everything timing decided: the order in which updates reached
the syncer, when each round closed and whom it admitted, and at which inner
step each learner adopted each fragment version. Replaying drives fresh
learners and a fresh syncer core through exactly that sequence, so the final
global parameters must hash the same; any record that does not reproduce
(an update's counters, an acknowledgement, a round's admitted set) stops the
replay with the line that diverged.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

from ddctl.config.train import TrainConfig, from_json
from ddctl.errors import ReplayDivergence
from ddctl.local.virtual_cluster import cluster_syncer
from ddctl_agents.core.effects import Record, Send
from ddctl_agents.core.messages import FragmentVersion, decode_fragment, decode_update, encode_fragment, encode_update
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.tape import read_tape
from ddctl_agents.errors import TapeError
from ddctl_agents.train.assembly import Assembly, learner_index
from ddctl_agents.train.checksum import params_sha256
from ddctl_agents.train.learner import Learner

HISTORY = 64
"""Fragment versions kept per fragment for learners that adopt late."""


class Replayer:
    """Feeds one tape's records, in order, through fresh learners and a fresh syncer."""

    def __init__(self, assembly: Assembly) -> None:
        self.a = assembly
        self.syncer: Synchronizer = cluster_syncer(assembly)
        self.learners: dict[str, Learner] = {}
        self.history: dict[tuple[int, int], FragmentVersion] = {}
        self.order: dict[int, deque[int]] = {}
        for p in range(assembly.fragmentation.count):
            self._remember(self.syncer.fragment_message(p))

    def apply(self, number: int, record: dict[str, Any]) -> None:
        kind, t = record["type"], float(record.get("t", 0.0))
        if kind == "join":
            index, start, cadence = learner_index(record["learner"]), record.get("start_step", 0), record.get("cadence", 1)
            self.learners[record["learner"]] = self.a.new_learner(index, record["incarnation"], start, cadence=cadence)
            self._effects(self.syncer.register(t, record["learner"], record["incarnation"], start, cadence))
        elif kind == "leave":
            self._effects(self.syncer.deregister(t, record["learner"], record["reason"]))
        elif kind == "update":
            self._update(number, t, record)
        elif kind == "readmit":
            self.syncer.readmit(t, record["learner"])
        elif kind == "fault":
            self.syncer.discard_round(t, record["fragment"], record["reason"])
        elif kind == "round":
            effects = self.syncer.close_round(
                t, record["fragment"], record["cause"], record["reason"], record.get("grace_s", 0.0)
            )
            made = next(e.entry for e in effects if isinstance(e, Record))
            if made["version"] != record["version"] or made["admitted"] != record["admitted"]:
                raise ReplayDivergence(
                    f"line {number}: round of fragment {record['fragment']} admitted {made['admitted']}, "
                    f"tape says {record['admitted']}"
                )
            self._effects(effects)

    def _update(self, number: int, t: float, record: dict[str, Any]) -> None:
        learner = self.learners.get(record["learner"])
        if learner is None or learner.incarnation != record["incarnation"]:
            raise ReplayDivergence(
                f"line {number}: update from {record['learner']} incarnation {record['incarnation']} before it joined"
            )
        for p, version, step in record["adoptions"]:
            self._advance(learner, step, number)
            if (p, version) not in self.history:
                raise ReplayDivergence(f"line {number}: version {version} of fragment {p} is not in the replay history")
            learner.adopt(self.history[(p, version)])
        self._advance(learner, record["step"], number)
        update = learner.make_update(record["fragment"])
        if (update.update_id, update.c_steps, update.c_tokens) != (record["update_id"], record["c_steps"], record["c_tokens"]):
            raise ReplayDivergence(f"line {number}: replayed update {update.update_id} does not match the tape")
        frame = encode_update(update, self.a.config.sync.codec, self.a.config.sync.block)
        decoded, _ = decode_update(frame)
        ack, effects = self.syncer.receive(t, decoded, len(frame))
        if ack.status != record["status"]:
            raise ReplayDivergence(f"line {number}: update {update.update_id} was {ack.status}, tape says {record['status']}")
        self._effects(effects)

    def _advance(self, learner: Learner, step: int, number: int) -> None:
        if step < learner.step:
            raise ReplayDivergence(f"line {number}: {learner.name} is at step {learner.step}, tape asks for step {step}")
        while learner.step < step:
            learner.train_step()

    def _effects(self, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, Send) and effect.reason == "round":
                self._remember(effect.message)

    def _remember(self, message: FragmentVersion) -> None:
        """Keep the version as learners received it: through the downlink codec."""
        frame = encode_fragment(message, self.a.config.down_codec, self.a.config.sync.block)
        decoded, _ = decode_fragment(frame)
        self.history[(message.fragment, message.version)] = decoded
        versions = self.order.setdefault(message.fragment, deque())
        versions.append(message.version)
        while len(versions) > HISTORY:
            self.history.pop((message.fragment, versions.popleft()), None)


def replay_tape(path: Path) -> dict[str, Any]:
    """Replay ``path``; returns val_bpb and params_sha256 and whether they match the tape."""
    started = time.perf_counter()
    records = read_tape(path)
    header = next(records)
    config = from_json(TrainConfig, header["config"])
    assembly = Assembly.build(config)
    if assembly.corpus.sha256 != header.get("corpus_sha256"):
        recorded = str(header.get("corpus_sha256"))[:12]
        raise TapeError(f"{path}: the corpus differs from the recorded one (sha256 {assembly.corpus.sha256[:12]} vs {recorded})")
    replayer = Replayer(assembly)
    end: dict[str, Any] | None = None
    for number, record in enumerate(records, 2):
        if record["type"] == "end":
            end = record
            break
        replayer.apply(number, record)
    if end is None:
        raise TapeError(f"{path}: the tape has no end record (the run did not finish); nothing to compare")
    params = replayer.syncer.global_params()
    digest = params_sha256(params)
    return {
        "val_bpb": assembly.evaluate(params),
        "params_sha256": digest,
        "recorded_sha256": end["params_sha256"],
        "match": digest == end["params_sha256"],
        "rounds": replayer.syncer.rounds_closed,
        "wall_s": time.perf_counter() - started,
    }

"""`ddctl replay TAPE`: re-run a recorded run from its tape and check it matches.

The tape fixes everything timing decided: the order in which updates reached
the syncer, when each round closed and whom it admitted, and at which inner
step each learner adopted each fragment version. Replaying drives fresh
learners and a fresh syncer core through exactly that sequence, so the final
global parameters must hash the same; any record that does not reproduce
(an update's counters, an acknowledgement, a round's admitted set) stops the
replay with the line that diverged.

A sharded run leaves one tape per shard; ``replay_tapes`` takes them all, merges
them in a causal order (``local/causal_order.py``) and replays each record at
its own shard's core, the learners shared, as the run itself did.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddctl.config.train import TrainConfig, from_json
from ddctl.errors import ReplayDivergence
from ddctl.local.causal_order import causal_order, record_time
from ddctl.local.shards import Shards
from ddctl_agents.core.effects import Record, Send
from ddctl_agents.core.messages import FragmentVersion, decode_update, encode_update
from ddctl_agents.core.tape import read_tape
from ddctl_agents.core.version_delta import coder
from ddctl_agents.errors import TapeError
from ddctl_agents.train.assembly import Assembly, learner_index
from ddctl_agents.train.checksum import params_sha256
from ddctl_agents.train.learner import Learner

HISTORY = 64
"""Fragment versions kept per fragment for learners that adopt late."""


class Replayer:
    """Feeds the records of a run's tapes, in order, through fresh learners and fresh synchronizer cores."""

    def __init__(self, assembly: Assembly, shards: int = 1) -> None:
        self.a = assembly
        self.shards = Shards(assembly, shards)
        self.learners: dict[str, Learner] = {}
        self.history: dict[tuple[int, int], tuple[FragmentVersion, FragmentVersion]] = {}
        """(fragment, version) -> (as learners following the chain hold it, as a learner at cadence k > 1 adopts it)."""
        self.versions = coder(assembly.config.down_codec, assembly.config.sync.block)
        self.order: dict[int, deque[int]] = {}
        for p in range(assembly.fragmentation.count):
            self._remember(self.shards.owner(p).fragment_message(p))

    def apply(self, where: str, record: dict[str, Any], shard: int = 0) -> None:
        """Replay ``record`` of shard ``shard``'s tape (``where`` names it in a divergence)."""
        kind, t, core = record["type"], record_time(record), self.shards.cores[shard]
        fragment = record.get("fragment", 0)
        if isinstance(fragment, bool) or not isinstance(fragment, int) or not 0 <= fragment < len(self.shards.owners):
            raise ReplayDivergence(f"{where}: fragment {fragment!r:.40} is not one of the run's {len(self.shards.owners)}")
        if kind == "join":
            name, incarnation = record["learner"], record["incarnation"]
            start, cadence = record.get("start_step", 0), record.get("cadence", 1)
            known = self.learners.get(name)
            if known is None or known.incarnation != incarnation:  # a sharded run's learner joins every shard once
                self.learners[name] = self.a.new_learner(learner_index(name), incarnation, start, cadence=cadence)
            self._effects(core.register(t, name, incarnation, start, cadence))
        elif kind == "leave":
            self._effects(core.deregister(t, record["learner"], record["reason"]))
        elif kind == "update":
            self._update(where, t, record, shard)
        elif kind == "readmit":
            core.readmit(t, record["learner"])
        elif kind == "fault":
            core.discard_round(t, record["fragment"], record["reason"])
        elif kind == "round":
            effects = core.close_round(t, record["fragment"], record["cause"], record["reason"], record.get("grace_s", 0.0))
            made = next(e.entry for e in effects if isinstance(e, Record))
            if made["version"] != record["version"] or made["admitted"] != record["admitted"]:
                raise ReplayDivergence(
                    f"{where}: round of fragment {record['fragment']} admitted {made['admitted']}, tape says {record['admitted']}"
                )
            self._effects(effects)

    def _update(self, where: str, t: float, record: dict[str, Any], shard: int) -> None:
        learner = self.learners.get(record["learner"])
        if learner is None or learner.incarnation != record["incarnation"]:
            who = f"{record['learner']} incarnation {record['incarnation']}"
            raise ReplayDivergence(f"{where}: update from {who} before it joined")
        if self.shards.owners[record["fragment"]] != shard:
            raise ReplayDivergence(f"{where}: an update of fragment {record['fragment']} on the tape of a shard not owning it")
        for p, version, step in record["adoptions"]:
            self._advance(learner, step, where)
            if (p, version) not in self.history:
                raise ReplayDivergence(f"{where}: version {version} of fragment {p} is not in the replay history")
            followed, rounded = self.history[(p, version)]
            learner.adopt(rounded if learner.cadence > 1 else followed)  # held: sent each whole (bf16)
        self._advance(learner, record["step"], where)
        state = learner.state[record["fragment"]]
        if state.version < 0 or state.c_steps == 0:  # the tape's order cannot be the run's: nothing to send here
            raise ReplayDivergence(f"{where}: {learner.name} has no drift of fragment {record['fragment']} to send")
        update = learner.make_update(record["fragment"])
        if (update.update_id, update.c_steps, update.c_tokens) != (record["update_id"], record["c_steps"], record["c_tokens"]):
            raise ReplayDivergence(f"{where}: replayed update {update.update_id} does not match the tape")
        frame = encode_update(update, self.a.config.sync.codec, self.a.config.sync.block)
        decoded, _ = decode_update(frame)
        ack, effects = self.shards.cores[shard].receive(t, decoded, len(frame))
        if ack.status != record["status"]:
            raise ReplayDivergence(f"{where}: update {update.update_id} was {ack.status}, tape says {record['status']}")
        self._effects(effects)

    def _advance(self, learner: Learner, step: int, where: str) -> None:
        if step < learner.step:
            raise ReplayDivergence(f"{where}: {learner.name} is at step {learner.step}, tape asks for step {step}")
        while learner.step < step:
            learner.train_step()

    def _effects(self, effects: list[Any]) -> None:
        for effect in effects:
            if isinstance(effect, Send) and effect.reason == "round":
                self._remember(effect.message)

    def _remember(self, message: FragmentVersion) -> None:
        """Keep the version as learners received it: through the downlink codec."""
        coded = self.versions.code(message)  # kept without its frames: only what learners adopt
        self.history[(message.fragment, message.version)] = (coded.message, coded.rounded)
        versions = self.order.setdefault(message.fragment, deque())
        versions.append(message.version)
        while len(versions) > HISTORY:
            self.history.pop((message.fragment, versions.popleft()), None)


def replay_tape(path: Path) -> dict[str, Any]:
    """Replay one synchronizer's tape; see ``replay_tapes``."""
    return replay_tapes([path])


def replay_tapes(paths: Sequence[Path]) -> dict[str, Any]:
    """Replay a run from its tapes (one, or one per shard in any order); returns val_bpb and params_sha256 and
    whether they match what the tapes recorded."""
    started = time.perf_counter()
    loaded = [(path, _load(path)) for path in paths]
    config, assembly = _check_together(loaded)
    loaded.sort(key=lambda pair: _shard_index(pair[1][0]))  # tape i is shard Si's
    paths, tapes = [path for path, _ in loaded], [tape for _, tape in loaded]
    replayer = Replayer(assembly, config.cluster.shards)
    bodies = [tape[1:-1] for tape in tapes]
    for t, i in causal_order(bodies, replayer.shards.names):
        where = f"line {i + 2}" if len(paths) == 1 else f"line {i + 2} of {paths[t].name}"
        try:
            replayer.apply(where, bodies[t][i], t)
        except (KeyError, TypeError, ValueError, IndexError) as exc:  # a field missing or of the wrong kind
            raise TapeError(f"{where}: a malformed {bodies[t][i]['type']} record ({type(exc).__name__}: {exc})") from None
    params = replayer.shards.global_params()
    digest = params_sha256(params)
    recorded = tapes[0][-1]["params_sha256"]
    return {
        "val_bpb": assembly.evaluate(params),
        "params_sha256": digest,
        "recorded_sha256": recorded,
        "match": digest == recorded,
        "rounds": replayer.shards.rounds_closed,
        "shards": len(paths),
        "wall_s": time.perf_counter() - started,
    }


def _load(path: Path) -> list[dict[str, Any]]:
    """A tape's records from its config to its end (a tape without an end record is a run that did not finish)."""
    records = []
    for record in read_tape(path):
        records.append(record)
        if record["type"] == "end":
            return records
    raise TapeError(f"{path}: the tape has no end record (the run did not finish); nothing to compare")


def _check_together(loaded: list[tuple[Path, list[dict[str, Any]]]]) -> tuple[TrainConfig, Assembly]:
    """The tapes are one run's: the same config, corpus and result, and each of its shards' tape exactly once."""
    if not loaded:
        raise TapeError("give the run's tape (one per shard for a sharded run)")
    for path, tape in loaded:
        if tape[0].get("service"):
            raise TapeError(
                f"{path} is a synchronizer service's tape (ddctl syncer serve): replay re-runs the learners of a "
                "ddctl train --tape run; a service's learners trained on their own machines, outside what a tape holds"
            )
    (first, tape), *others = loaded
    header, end = tape[0], tape[-1]
    config = from_json(TrainConfig, header["config"])
    for path, other in others:
        if other[0]["config"] != header["config"] or other[-1].get("params_sha256") != end.get("params_sha256"):
            raise TapeError(f"{path} is not a tape of the same run as {first} (its config or its result differs)")
    n = config.cluster.shards
    names = [t[0].get("shard") for _, t in loaded]
    expected = [f"S{i}" for i in range(n)] if n > 1 else [None]
    if sorted(names, key=str) != sorted(expected, key=str):
        wanted = f"each of {', '.join(str(e) for e in expected)} once" if n > 1 else "its one tape"
        got = [name or "one syncer" for name in names]
        raise TapeError(f"this run had {n} synchronizer shard(s): give {wanted}; got tapes of {got}")
    assembly = Assembly.build(config)
    if assembly.corpus.sha256 != header.get("corpus_sha256"):
        recorded = str(header.get("corpus_sha256"))[:12]
        raise TapeError(f"{first}: the corpus differs from the recorded one (sha256 {assembly.corpus.sha256[:12]} vs {recorded})")
    return config, assembly


def _shard_index(header: dict[str, Any]) -> int:
    return int(str(header.get("shard") or "S0")[1:])

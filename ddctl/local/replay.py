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

A synchronizer service's tape replays too (``local/recorded.py`` says which
ones): its learners kept uploads in flight and let queued updates absorb newer
ones, so each learner's updates are made again in the learner's own order
(``local/remaking.py``), not the order they arrived in.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddctl.errors import ReplayDivergence
from ddctl.local.causal_order import causal_order, record_time
from ddctl.local.recorded import load_run
from ddctl.local.remaking import Remaker
from ddctl.local.shards import Shards
from ddctl_agents.core.effects import Record, Send
from ddctl_agents.core.messages import Adoption, FragmentVersion, decode_update
from ddctl_agents.core.shard_syncer import ShardSynchronizer
from ddctl_agents.core.shardmap import ShardMap
from ddctl_agents.core.version_delta import coder
from ddctl_agents.errors import ConfigError, TapeError
from ddctl_agents.train.assembly import Assembly, learner_index
from ddctl_agents.train.checksum import params_sha256
from ddctl_agents.train.learner import Learner

HISTORY = 64
"""Fragment versions kept per fragment for learners that adopt late."""


class Replayer:
    """Feeds the records of a run's tapes, in order, through fresh learners and fresh synchronizer cores."""

    def __init__(self, assembly: Assembly, shards: int | ShardMap = 1, service: bool = False) -> None:
        self.a = assembly
        self.shards = Shards(assembly, shards, shared_budget=not service)
        self.learners: dict[str, Learner] = {}
        self.history: dict[tuple[int, int], tuple[FragmentVersion, FragmentVersion]] = {}
        """(fragment, version) -> (as learners following the chain hold it, as a learner at cadence k > 1 adopts it)."""
        self.versions = coder(assembly.config.down_codec, assembly.config.sync.block)
        self.order: dict[int, deque[int]] = {}
        self.remaker = Remaker(self._catch_up, assembly.config.sync.codec, assembly.config.sync.block)
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
        elif kind == "handoff":
            self._handoff(where, t, record, shard)
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
        frame = self.remaker.frame(learner, record, where)
        decoded, _ = decode_update(frame)
        ack, effects = self.shards.cores[shard].receive(t, decoded, len(frame))
        if ack.status != record["status"]:
            raise ReplayDivergence(f"{where}: update {decoded.update_id} was {ack.status}, tape says {record['status']}")
        self._effects(effects)

    def _handoff(self, where: str, t: float, record: dict[str, Any], shard: int) -> None:
        """A fragment given away (its record names the other shard), or taken in: what its owner exports now."""
        p, to, core, giver = record["fragment"], record["to"], self.shards.cores[shard], self.shards.owner(record["fragment"])
        if not isinstance(core, ShardSynchronizer) or not isinstance(giver, ShardSynchronizer):
            raise ReplayDivergence(f"{where}: a handoff on the tape of a synchronizer that is not one of several shards")
        try:
            if to != self.shards.names[shard]:
                self._effects(core.hand_out(t, p, to, record["epoch"]))
                return
            effects = core.hand_in(t, giver.export(p))
        except ConfigError as exc:
            raise ReplayDivergence(f"{where}: the handoff of fragment {p} to {to} does not replay: {exc}") from None
        if core.versions[p] != record["version"]:
            raise ReplayDivergence(f"{where}: fragment {p} moved at version {core.versions[p]}, tape says {record['version']}")
        self.shards.moved(p, shard)
        self._effects(effects)

    def _catch_up(self, learner: Learner, adoptions: Sequence[Adoption], step: int, where: str) -> None:
        """What the learner did before it made an update: adopt these versions at their steps, train to ``step``."""
        for p, version, at in adoptions:
            self._advance(learner, at, where)
            if (p, version) not in self.history:
                raise ReplayDivergence(f"{where}: version {version} of fragment {p} is not in the replay history")
            followed, rounded = self.history[(p, version)]
            learner.adopt(rounded if learner.cadence > 1 else followed)  # held: sent each whole (bf16)
        self._advance(learner, step, where)

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
    """Replay a run from its tapes (one, or one per shard in any order; a ``ddctl train --tape`` run's or a
    synchronizer service's); returns val_bpb and params_sha256 and whether they match what the tapes recorded."""
    started = time.perf_counter()
    run = load_run(paths)
    replayer = Replayer(run.assembly, run.shards, run.service)
    bodies = run.bodies
    replayer.remaker.index(record for body in bodies for record in body)
    # A service's learners keep several uploads in flight: their updates may arrive out of the order they made them.
    for t, i in causal_order(bodies, replayer.shards.names, learners_in_order=not run.service):
        where = f"line {i + 2}" if len(bodies) == 1 else f"line {i + 2} of {run.paths[t].name}"
        try:
            replayer.apply(where, bodies[t][i], t)
        except (KeyError, TypeError, ValueError, IndexError) as exc:  # a field missing or of the wrong kind
            raise TapeError(f"{where}: a malformed {bodies[t][i]['type']} record ({type(exc).__name__}: {exc})") from None
    params = replayer.shards.global_params()
    digest = params_sha256(params)
    names = run.assembly.fragmentation.fragments
    ends = run.ends()
    parts = [(params_sha256({s.name: params[s.name] for p in owned for s in names[p]}), said) for owned, said in ends]
    whole = [recorded for owned, recorded in ends if len(owned) == len(names)]
    return {
        "val_bpb": run.assembly.evaluate(params),
        "params_sha256": digest,
        "recorded_sha256": whole[0] if whole else None,
        "match": all(made == recorded for made, recorded in parts),
        "rounds": replayer.shards.rounds_closed,
        "shards": len(run.paths),
        "service": run.service,
        "lost_updates": replayer.remaker.lost,
        "wall_s": time.perf_counter() - started,
    }

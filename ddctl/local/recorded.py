"""A recorded run's tapes, checked to be one run's, and what its replay needs of them.

Two kinds of run leave tapes. ``ddctl train --tape`` (the virtual cluster) writes its configuration, with the
cluster's shards, and ends every tape with the whole model's hash. A synchronizer service (``ddctl syncer
serve``, ``ddctl up``) writes the job, the shard and the shard map it started from (``service/taping.py``) and
ends its tape with the hash of the fragments it owns; its learners ran on their own machines, but each update
on the tape says what its learner did before making it (the versions it adopted, at which steps, and the
updates it took in), so fresh learners can do it again. What a replay cannot start from is refused here with the
reason: a run resumed from a checkpoint, a model whose files are not on this machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddctl.config.train import TrainConfig, from_json
from ddctl_agents.core.shardmap import ShardMap, parse
from ddctl_agents.core.tape import read_tape
from ddctl_agents.errors import ConfigError, TapeError
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checksum import is_sha256
from ddctl_agents.train.job import JobConfig


@dataclass(frozen=True, slots=True)
class Recorded:
    """A run's tapes in shard order, with the job they replay."""

    paths: list[Path]
    tapes: list[list[dict[str, Any]]]
    assembly: Assembly
    shards: int | ShardMap
    service: bool

    @property
    def bodies(self) -> list[list[dict[str, Any]]]:
        """Each tape's records between its header and its end."""
        return [tape[1:-1] for tape in self.tapes]

    def ends(self) -> list[tuple[list[int], str]]:
        """What each tape's end record claims: the fragments it hashed (every one, for a virtual cluster's) and the hash."""
        every = list(range(self.assembly.fragmentation.count))
        return [(list(tape[-1].get("fragments", every)), str(tape[-1].get("params_sha256"))) for tape in self.tapes]


def load_run(paths: Sequence[Path]) -> Recorded:
    """The tapes of one run, in shard order; TapeError says what is missing, foreign or beyond a replay."""
    loaded = [(path, _load(path)) for path in paths]
    if not loaded:
        raise TapeError("give the run's tape (one per shard for a sharded run)")
    kinds = {bool(tape[0].get("service")) for _, tape in loaded}
    if len(kinds) > 1:
        raise TapeError("these tapes mix a synchronizer service's and a ddctl train run's: give one run's tapes")
    service = kinds.pop()
    (first, tape), *others = loaded
    header = tape[0]
    for path, other in others:
        same_result = service or other[-1].get("params_sha256") == tape[-1].get("params_sha256")
        if other[0].get("config") != header.get("config") or not same_result:
            raise TapeError(f"{path} is not a tape of the same run as {first} (its config or its result differs)")
    config: JobConfig | TrainConfig
    try:
        if service:
            config, shards = from_json(JobConfig, header["config"]), _service_shards(loaded)
        else:
            cluster: TrainConfig = from_json(TrainConfig, header["config"])
            config, shards = cluster, _cluster_shards(loaded, cluster.cluster.shards)
    except (ConfigError, KeyError, TypeError, ValueError) as exc:  # a tape is a file: anything may be in it
        raise TapeError(f"{first}: its header does not hold a {'job' if service else 'run'}'s config ({exc!s:.200})") from None
    if service:
        _replayable(loaded)
    names = shards.shards if isinstance(shards, ShardMap) else tuple(f"S{i}" for i in range(shards))
    loaded.sort(key=lambda pair: names.index(str(pair[1][0].get("shard") or "S0")))  # tape i is shard i's
    model_dir = header.get("model_dir")
    assembly = Assembly.build(config, model_dir=Path(model_dir) if model_dir else None)
    if assembly.corpus.sha256 != header.get("corpus_sha256"):
        recorded = str(header.get("corpus_sha256"))[:12]
        raise TapeError(f"{first}: the corpus differs from the recorded one (sha256 {assembly.corpus.sha256[:12]} vs {recorded})")
    for path, other in loaded:
        _check_end(path, other[-1], assembly.fragmentation.count)
    return Recorded([p for p, _ in loaded], [t for _, t in loaded], assembly, shards, service)


def _load(path: Path) -> list[dict[str, Any]]:
    """A tape's records from its config to its end (a tape without an end record is a run that did not finish)."""
    records = []
    for record in read_tape(path):
        records.append(record)
        if record["type"] == "end":
            return records
    raise TapeError(f"{path}: the tape has no end record (the run did not finish); nothing to compare")


def _check_end(path: Path, end: dict[str, Any], fragments: int) -> None:
    """An end record names a sha256 and, if it says which, fragments of this job, each once."""
    digest, owned = end.get("params_sha256"), end.get("fragments", list(range(fragments)))
    if not is_sha256(digest):
        raise TapeError(f"{path}: its end record's params_sha256 is not a sha256 ({digest!r:.80})")
    valid = isinstance(owned, list) and all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p < fragments for p in owned)
    if not valid or len(set(owned)) != len(owned):
        raise TapeError(f"{path}: its end record's fragments must be distinct ones of the job's {fragments}, got {owned!r:.80}")


def _cluster_shards(loaded: list[tuple[Path, list[dict[str, Any]]]], n: int) -> int:
    names = [t[0].get("shard") for _, t in loaded]
    expected = [f"S{i}" for i in range(n)] if n > 1 else [None]
    if sorted(names, key=str) != sorted(expected, key=str):
        wanted = f"each of {', '.join(str(e) for e in expected)} once" if n > 1 else "its one tape"
        got = [name or "one syncer" for name in names]
        raise TapeError(f"this run had {n} synchronizer shard(s): give {wanted}; got tapes of {got}")
    return n


def _service_shards(loaded: list[tuple[Path, list[dict[str, Any]]]]) -> int | ShardMap:
    """One synchronizer (1), or the shard map every shard's tape started from, each shard's tape given once."""
    (first, tape), *_ = loaded
    if "shard_map" not in tape[0]:
        if len(loaded) > 1:
            raise TapeError(f"{first} is the tape of a synchronizer that owned every fragment: give it alone")
        return 1
    try:
        shard_map = parse(tape[0]["shard_map"])
    except ConfigError as exc:
        raise TapeError(f"{first}: its header's shard map: {exc}") from None
    names = [t[0].get("shard") for _, t in loaded]
    one_map = all(t[0].get("shard_map") == tape[0]["shard_map"] for _, t in loaded)
    if not one_map or sorted(map(str, names)) != sorted(shard_map.shards):
        raise TapeError(
            f"this run had the synchronizer shards {', '.join(shard_map.shards)}: give each one's tape once, all from "
            f"the same shard map; got tapes of {[str(n) for n in names]}"
        )
    return shard_map


def _replayable(loaded: list[tuple[Path, list[dict[str, Any]]]]) -> None:
    """What a service's replay cannot start from, refused with the reason."""
    for path, tape in loaded:
        if tape[0].get("resumed_from"):
            raise TapeError(
                f"{path}: the run resumed from the checkpoint {tape[0]['resumed_from']}; a replay starts from the job's "
                "initial model, so it cannot reproduce it"
            )
        model_dir = tape[0].get("model_dir")
        if model_dir and not Path(model_dir).is_dir():
            raise TapeError(f"{path}: the run's model was imported from {model_dir}, which is not on this machine")

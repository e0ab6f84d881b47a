"""A sharded synchronizer in the virtual cluster: one tape per shard, merged in a causal order by ``ddctl replay``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from builders import small_run
from ddctl.cli.app import app
from ddctl.config.train import ClusterConfig, Outage
from ddctl.errors import ReplayDivergence
from ddctl.local.causal_order import causal_order
from ddctl.local.replay import Replayer, replay_tapes
from ddctl.local.training import train_decoupled
from ddctl.local.virtual_cluster import VirtualCluster
from ddctl_agents.core.config import QuorumConfig
from ddctl_agents.errors import ConfigError, TapeError
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checksum import params_sha256

HETERO = ClusterConfig(speeds=(1.0, 0.6, 1.3), outages=(Outage(learner=2, at=6.0, duration=5.0),), shards=2)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, Any]]:
    path = tmp_path_factory.mktemp("shards") / "run.jsonl"
    run = train_decoupled(small_run(tokens=40_000, learners=3, cluster=HETERO), path)
    return [Path(p) for p in run["tapes"]], run


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_shard_writes_its_own_tape_of_its_own_fragments(sharded: tuple[list[Path], dict[str, Any]]) -> None:
    paths, run = sharded
    assert [p.name for p in paths] == ["run.S0.jsonl", "run.S1.jsonl"] and run["shards"] == 2
    assert run["ledger"]["balanced"]
    tapes = [records(p) for p in paths]
    rounds = 0
    for index, tape in enumerate(tapes):
        assert tape[0]["type"] == "config" and tape[0]["shard"] == f"S{index}" and tape[-1]["type"] == "end"
        assert tape[-1]["params_sha256"] == run["params_sha256"]
        mine = [r for r in tape if r["type"] in ("update", "round")]
        assert mine and all(r["fragment"] % 2 == index for r in mine)  # fragments dealt round robin
        assert {r["learner"] for r in tape if r["type"] == "join"} == {"L0", "L1", "L2"}  # every learner joins every shard
        assert all(f"S{1 - index}" in r["vclock"] for r in tape if "vclock" in r)  # one clock entry per shard
        rounds += sum(r["type"] == "round" for r in tape)
    assert rounds == run["rounds"]
    # a learner carries one shard's clock to the other: some update at S1 has seen S0's events
    assert any(r["vclock"].get("S0", 0) > 0 for r in tapes[1] if r["type"] == "update")


@pytest.mark.slow
def test_replay_merges_the_shards_tapes_and_reproduces_the_run_bit_for_bit(sharded: tuple[list[Path], dict[str, Any]]) -> None:
    paths, run = sharded
    result = CliRunner().invoke(app, ["replay", str(paths[1]), str(paths[0]), "--json"])  # any order
    assert result.exit_code == 0, result.output
    replayed = json.loads(result.stdout)
    assert replayed["match"] and replayed["params_sha256"] == run["params_sha256"]
    assert replayed["val_bpb"] == run["val_bpb"] and replayed["rounds"] == run["rounds"] and replayed["shards"] == 2


@pytest.mark.slow
def test_the_causal_order_alone_reproduces_the_run_and_a_naive_one_does_not(sharded: tuple[list[Path], dict[str, Any]]) -> None:
    """With the recorded times taken away, clocks, tape order and update ids still order the records well enough
    to reproduce the run; one shard's tape after the other's does not."""
    paths, run = sharded
    config, bodies = small_run(tokens=40_000, learners=3, cluster=HETERO), [records(p)[1:-1] for p in paths]

    def replay(order: list[tuple[int, int]]) -> str:
        replayer = Replayer(Assembly.build(config), 2)
        for t, i in order:
            replayer.apply(f"{t}:{i}", bodies[t][i], t)
        return params_sha256(replayer.shards.global_params())

    timeless = [[{k: v for k, v in r.items() if k != "t"} for r in body] for body in bodies]
    assert replay(causal_order(timeless, ["S0", "S1"])) == run["params_sha256"]
    naive = [(t, i) for t, body in enumerate(bodies) for i in range(len(body))]
    with pytest.raises(ReplayDivergence, match="not in the replay history|is at step|before it joined|no drift"):
        replay(naive)


@pytest.mark.slow
def test_with_a_full_quorum_sharding_changes_nothing_of_the_math() -> None:
    """Every fragment has its own rounds and Nesterov buffer: at K = M (no forecast decides a round) one
    synchronizer and shards give the same parameters bit for bit."""
    base = small_run(tokens=24_000, learners=3, cluster=ClusterConfig(speeds=(1.0, 0.6, 1.3)))
    base = dataclasses.replace(base, syncer=dataclasses.replace(base.syncer, quorum=QuorumConfig(quorum=3, grace=True)))
    runs = [train_decoupled(dataclasses.replace(base, cluster=dataclasses.replace(base.cluster, shards=n))) for n in (1, 3)]
    assert runs[0]["params_sha256"] == runs[1]["params_sha256"] and runs[0]["rounds"] == runs[1]["rounds"]
    assert runs[1]["shards"] == 3 and runs[1]["ledger"]["balanced"]


def test_train_says_where_each_shards_tape_went(tmp_path: Path) -> None:
    args = ["train", "--tokens", "4000", "--learners", "2", "--fragments", "4", "--batch-size", "4", "--max-bytes", "1048576"]
    result = CliRunner().invoke(app, [*args, "--shards", "2", "--tape", str(tmp_path / "run.jsonl")])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["run.S0.jsonl", "run.S1.jsonl"]
    flat = "".join(line.strip(" │┃").strip() for line in result.stdout.splitlines())  # a table folds long paths
    assert "tapes" in result.stdout and all(name in flat for name in written)


def test_a_run_refuses_more_shards_than_fragments_and_tapes_that_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"shards \(5\) must not outnumber fragments \(4\)"):
        small_run(cluster=ClusterConfig(shards=5))
    with pytest.raises(ConfigError, match=r"shards must be an integer in \[1, 64\], got 0"):
        ClusterConfig(shards=0)
    (tmp_path / "run.S1.jsonl").write_text("{}\n")
    with pytest.raises(FileExistsError, match="run.S1.jsonl already exists"):
        train_decoupled(small_run(cluster=ClusterConfig(shards=2)), tmp_path / "run.jsonl")
    assert not (tmp_path / "run.S0.jsonl").exists()  # refused before any tape was started


def test_replay_refuses_a_missing_a_doubled_or_a_foreign_tape(sharded: tuple[list[Path], dict[str, Any]], tmp_path: Path) -> None:
    paths, _ = sharded
    with pytest.raises(TapeError, match=r"2 synchronizer shard\(s\): give each of S0, S1 once; got tapes of \['S0'\]"):
        replay_tapes(paths[:1])
    with pytest.raises(TapeError, match="give each of S0, S1 once"):
        replay_tapes([paths[0], paths[0]])
    foreign = tmp_path / "other.jsonl"
    lines = paths[1].read_text().splitlines()
    header = json.loads(lines[0])
    header["config"]["inner"]["seed"] += 1
    foreign.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(TapeError, match="other.jsonl is not a tape of the same run"):
        replay_tapes([paths[0], foreign])
    unfinished = tmp_path / "unfinished.jsonl"
    unfinished.write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(TapeError, match="no end record"):
        replay_tapes([paths[0], unfinished])
    stray = tmp_path / "stray.jsonl"
    at = next(i for i, line in enumerate(lines) if '"type":"update"' in line)
    bad = json.loads(lines[at]) | {"fragment": 99}
    stray.write_text("\n".join([*lines[:at], json.dumps(bad), *lines[at + 1 :]]) + "\n")
    with pytest.raises(ReplayDivergence, match="fragment 99 is not one of the run's 4"):
        replay_tapes([paths[0], stray])
    broken = tmp_path / "broken.jsonl"
    at = next(i for i, line in enumerate(lines) if '"type":"join"' in line)
    join = {k: v for k, v in json.loads(lines[at]).items() if k != "learner"}
    broken.write_text("\n".join([*lines[:at], json.dumps(join), *lines[at + 1 :]]) + "\n")
    with pytest.raises(TapeError, match=r"a malformed join record \(KeyError: 'learner'\)"):
        replay_tapes([paths[0], broken])
    service = tmp_path / "tape.jsonl"
    service.write_text("\n".join([json.dumps(header | {"service": True}), *lines[1:]]) + "\n")
    with pytest.raises(TapeError, match="mix a synchronizer service's and a ddctl train run's"):
        replay_tapes([paths[0], service])  # a service's tape replays (tests/test_service_replay.py), not among these
    result = CliRunner().invoke(app, ["replay", str(paths[0])])
    assert result.exit_code == 3 and "give each of S0, S1 once" in result.stderr and "Traceback" not in result.output


def _update(learner: str, n: int, clock: dict[str, int], t: float = 0.0) -> dict[str, Any]:
    return {"type": "update", "learner": learner, "update_id": f"{learner}.0.{n}", "vclock": clock, "t": t}


def test_causal_order_follows_clocks_and_learners_over_recorded_times() -> None:
    s0 = [
        {"type": "join", "learner": "L0", "incarnation": 0, "vclock": {"S0": 1}, "t": 0.0},
        {"type": "round", "vclock": {"S0": 2}, "t": 5.0},
        _update("L0", 2, {"S0": 3, "L0": 3}, t=6.0),
    ]
    s1 = [
        {"type": "join", "learner": "L0", "incarnation": 0, "vclock": {"S1": 1}, "t": 0.0},
        _update("L0", 1, {"S1": 2, "S0": 2, "L0": 2}, t=1.0),  # saw S0's round, though recorded earlier
    ]
    order = causal_order([s0, s1], ["S0", "S1"])
    assert order.index((0, 1)) < order.index((1, 1)) < order.index((0, 2))  # S0's round, then L0's updates in id order
    assert sorted(order) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    # without constraints between them, the earlier recorded time goes first
    assert causal_order([[{"type": "leave", "t": 2.0}], [{"type": "leave", "t": 1.0}]], ["S0", "S1"]) == [(1, 0), (0, 0)]
    # a time that is no finite number counts as 0: it neither stops the merge nor goes unordered
    odd = [[{"type": "leave", "t": 10**400}], [{"type": "leave", "t": "soon"}], [{"type": "leave", "t": 0.5}]]
    assert causal_order(odd, ["S0", "S1", "S2"]) == [(0, 0), (1, 0), (2, 0)]


def test_a_fragment_is_taken_in_after_it_was_given_away_whatever_the_recorded_times() -> None:
    given = {"type": "handoff", "fragment": 1, "to": "S0", "epoch": 2, "t": 9.0}  # on S1's tape: to another shard
    taken = {"type": "handoff", "fragment": 1, "to": "S0", "epoch": 2, "t": 1.0}  # on S0's tape: its own
    assert causal_order([[taken], [given]], ["S0", "S1"]) == [(1, 0), (0, 0)]
    earlier_epoch = taken | {"epoch": 1}  # another move: no constraint, the recorded time decides
    assert causal_order([[earlier_epoch], [given]], ["S0", "S1"]) == [(0, 0), (1, 0)]


def test_a_new_incarnation_joins_after_its_previous_ones_updates() -> None:
    s0 = [_update("L0", 5, {"S0": 1, "L0": 9}, t=9.0)]
    s1 = [{"type": "join", "learner": "L0", "incarnation": 1, "vclock": {"S1": 1}, "t": 0.0}]
    assert causal_order([s0, s1], ["S0", "S1"]) == [(0, 0), (1, 0)]


def test_causal_order_refuses_contradictory_or_malformed_tapes() -> None:
    # each waits on the other: S0's first record saw S1's second event, and S1's first saw S0's second
    s0 = [{"type": "round", "vclock": {"S0": 1, "S1": 2}}, {"type": "round", "vclock": {"S0": 2}}]
    s1 = [{"type": "round", "vclock": {"S1": 1, "S0": 2}}, {"type": "round", "vclock": {"S1": 2}}]
    with pytest.raises(TapeError, match="contradict one another"):
        causal_order([s0, s1], ["S0", "S1"])
    with pytest.raises(TapeError, match="is not LEARNER.INCARNATION.N"):
        causal_order([[{"type": "update", "learner": "L0", "update_id": "L1.0.1"}]], ["S0"])
    with pytest.raises(TapeError, match=r"vector clock entry 'S0' must be an integer in \[0, 2\*\*53\), got -1"):
        causal_order([[{"type": "round", "vclock": {"S0": -1}}]], ["S0"])
    with pytest.raises(TapeError, match="incarnation must be a non-negative integer"):
        causal_order([[{"type": "join", "learner": "L0", "incarnation": "x"}]], ["S0"])
    with pytest.raises(TapeError, match="each named once"):
        causal_order([[], []], ["S0", "S0"])


@pytest.mark.slow
def test_a_shard_forecasts_a_learner_from_the_uplink_its_heartbeats_carry() -> None:
    """A shard only times the uploads sent to it; the learner's heartbeats carry its latest uplink sample to the
    others. Without that, two shards at K = 1 waited out the grace window for learners they had no reading of:
    6-22x the late merges and 0.02-0.05 bpb worse at 40k tokens (3 seeds). With it, two shards merge what one
    synchronizer merges, bit for bit (a round may close for another cause with the same learners in it)."""
    base = small_run(tokens=24_000, learners=3, cluster=ClusterConfig(speeds=(1.0, 0.6, 1.3)))
    assert base.syncer.quorum.quorum == 1 and base.syncer.quorum.grace
    runs = {}
    for n in (1, 2):
        cluster = VirtualCluster(Assembly.build(dataclasses.replace(base, cluster=dataclasses.replace(base.cluster, shards=n))))
        stats = cluster.run()
        runs[n] = (params_sha256(cluster.shards.global_params()), stats.causes, cluster)
    assert runs[1][0] == runs[2][0] and sum(runs[1][1].values()) == sum(runs[2][1].values())
    assert "none_coming" in runs[2][1]  # the forecasts decided rounds (not a full quorum)
    for core in runs[2][2].shards.cores:
        assert all(core.links[m].up.bytes_per_s for m in ("L0", "L1", "L2"))

"""A synchronizer service's tape replays: its learners' updates made again in their own order, bit for bit.

A real learner keeps uploads in flight (they arrive out of the order it made them) and lets a queued update
absorb a newer one of its fragment. The first test builds such a tape in process, exactly as the service's
core writes it; the last runs the real service with real learner processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.errors import ReplayDivergence
from ddctl.local.replay import replay_tapes
from ddctl.providers import linkshape
from ddctl_agents.core.effects import Record
from ddctl_agents.core.messages import Update, absorb, decode_update, encode_update
from ddctl_agents.core.tape import TAPE_FORMAT, read_tape
from ddctl_agents.core.version_delta import coder
from ddctl_agents.errors import TapeError
from ddctl_agents.jsonable import to_json
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checksum import params_sha256
from tests.service_harness import Job, small_job

runner = CliRunner()
INCARNATION = 7


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def service_header(assembly: Assembly, **extra: Any) -> dict[str, Any]:
    config, corpus = to_json(assembly.config), assembly.corpus.sha256
    return {"type": "config", "format": TAPE_FORMAT, "service": True, "config": config, "corpus_sha256": corpus} | extra


@pytest.fixture(scope="module")
def absorbing_run() -> tuple[Assembly, list[dict[str, Any]]]:
    """One learner's run as a service records it: its update of fragment 1 arrives before the earlier update of
    fragment 0, which took in a newer update of fragment 0 while it waited to be sent."""
    assembly = Assembly.build(small_job(learners=1, tokens=20_000))
    core, versions = assembly.new_syncer(), coder(assembly.config.down_codec, assembly.config.sync.block)
    records: list[dict[str, Any]] = [service_header(assembly)]

    def keep(effects: list[Any]) -> None:
        records.extend(e.entry for e in effects if isinstance(e, Record))

    def deliver(t: float, update: Update) -> None:
        frame = encode_update(update, assembly.config.sync.codec, assembly.config.sync.block)
        ack, effects = core.receive(t, decode_update(frame)[0], len(frame))
        assert ack.status == "accepted"
        keep(effects)

    learner = assembly.new_learner(0, INCARNATION)
    keep(core.register(0.0, "L0", INCARNATION))
    for p in range(assembly.fragmentation.count):
        learner.adopt(versions.code(core.fragment_message(p)).message)  # as the learner receives it: bf16

    def made_at(step: int, fragment: int) -> Update:
        while learner.step < step:
            learner.train_step()
        return learner.make_update(fragment)

    first, other, newer = made_at(3, 0), made_at(5, 1), made_at(7, 0)  # ids .0, .1, .2
    deliver(1.0, other)
    deliver(1.1, absorb(first, newer))
    for t, p in ((1.2, 0), (1.3, 1)):
        keep(core.close_round(t, p, "all_arrived", "all 1 live learners arrived"))
    learner.adopt(versions.code(core.fragment_message(0)).message)
    deliver(2.0, made_at(10, 0))  # id .3, carrying the adoption of version 1
    keep(core.close_round(2.1, 0, "all_arrived", "all 1 live learners arrived"))
    end = {"type": "end", "t": 3.0, "params_sha256": params_sha256(core.global_params()), "fragments": [0, 1, 2, 3]}
    return assembly, [*records, end]


def test_updates_that_arrived_out_of_order_or_absorbed_are_made_again_in_the_learners_order(
    absorbing_run: tuple[Assembly, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, records = absorbing_run
    updates = [r for r in records if r["type"] == "update"]
    assert [u["update_id"] for u in updates] == ["L0.7.1", "L0.7.2", "L0.7.3"]  # .1 first, .0 inside .2
    assert updates[1]["absorbed"] == [["L0.7.0", 3, 4]]  # made at step 3, with the four bootstrap adoptions
    replayed = replay_tapes([write(tmp_path / "tape.jsonl", records)])
    assert replayed["match"] and replayed["service"] and replayed["lost_updates"] == 0
    assert replayed["recorded_sha256"] == records[-1]["params_sha256"] and replayed["rounds"] == 3


def test_the_absorbed_updates_step_and_the_tapes_result_are_what_the_replay_checks(
    absorbing_run: tuple[Assembly, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, records = absorbing_run
    moved = [dict(r) for r in records]
    absorbing = next(r for r in moved if r.get("absorbed"))
    absorbing["absorbed"] = [["L0.7.0", 2, 4]]  # the same counters in sum, the older drift cut a step earlier
    assert not replay_tapes([write(tmp_path / "moved.jsonl", moved)])["match"]
    recounted = [dict(r) for r in records]
    next(r for r in recounted if r.get("absorbed"))["c_steps"] = 6
    with pytest.raises(ReplayDivergence, match="replayed update L0.7.2 does not match the tape"):
        replay_tapes([write(tmp_path / "recounted.jsonl", recounted)])
    far = [r | {"update_id": "L0.7.99999999999"} if r.get("update_id") == "L0.7.3" else r for r in records]
    with pytest.raises(ReplayDivergence, match="more than 4096 past any update on the tapes"):
        replay_tapes([write(tmp_path / "far.jsonl", far)])
    twice = [*records[:-1], next(r for r in records if r.get("update_id") == "L0.7.3"), records[-1]]
    with pytest.raises(ReplayDivergence, match="update L0.7.3 is on the tape twice"):
        replay_tapes([write(tmp_path / "twice.jsonl", twice)])
    wrong = write(tmp_path / "wrong.jsonl", [*records[:-1], records[-1] | {"params_sha256": "0" * 64}])
    result = runner.invoke(app, ["replay", str(wrong)])
    assert result.exit_code == 4, result.output


def test_a_learners_update_lost_in_flight_is_passed_over_and_counted(
    absorbing_run: tuple[Assembly, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Its process died with it in flight: the replay cannot make it, says so, and its later updates still line up."""
    _, records = absorbing_run
    without = [r for r in records if r.get("update_id") != "L0.7.1"]  # fragment 1's update never arrived
    for r in without:
        if r["type"] == "round" and r["fragment"] == 1:
            without.remove(r)
    replayed = replay_tapes([write(tmp_path / "lost.jsonl", without)])
    assert replayed["lost_updates"] == 1


def test_what_a_service_replay_cannot_start_from_is_refused_with_the_reason(
    absorbing_run: tuple[Assembly, list[dict[str, Any]]], tmp_path: Path
) -> None:
    assembly, records = absorbing_run
    header, body, end = records[0], records[1:-1], records[-1]
    cases = {
        "resumed from the checkpoint /ckpt": [header | {"resumed_from": "/ckpt"}, *body, end],
        "imported from /nowhere/model, which is not on this machine": [header | {"model_dir": "/nowhere/model"}, *body, end],
        "the tape has no end record": [header, *body],
        "its end record's params_sha256 is not a sha256": [header, *body, end | {"params_sha256": "cafe"}],
        "its end record's fragments must be distinct ones of the job's 4": [header, *body, end | {"fragments": [0, 0, 9]}],
        "its header does not hold a job's config": [header | {"config": {"inner": 3}}, *body, end],
    }
    absorbing = next(i for i, r in enumerate(body) if r.get("absorbed"))
    for bad in (5, [["L0.7.0", 3]], [["L0.7.0", "three", 4]]):
        mangled = [header, *body[:absorbing], body[absorbing] | {"absorbed": bad}, *body[absorbing + 1 :], end]
        with pytest.raises(TapeError, match="malformed update record"):
            replay_tapes([write(tmp_path / "t.jsonl", mangled)])
    for needle, tape in cases.items():
        with pytest.raises(TapeError, match=needle):
            replay_tapes([write(tmp_path / "t.jsonl", tape)])
    handoff = {"type": "handoff", "t": 1.0, "fragment": 0, "to": "S1", "epoch": 2, "version": 0}
    with pytest.raises(ReplayDivergence, match="line 3: a handoff on the tape of a synchronizer that is not one of several"):
        replay_tapes([write(tmp_path / "t.jsonl", [header, body[0], handoff, *body[1:], end])])
    shard_map = {"epoch": 1, "shards": ["S0", "S1"], "owners": [0, 1, 0, 1]}
    s0 = write(tmp_path / "s0.jsonl", [header | {"shard": "S0", "shard_map": shard_map}, end])
    with pytest.raises(TapeError, match="shards S0, S1: give each one's tape once"):
        replay_tapes([s0])
    with pytest.raises(TapeError, match="owned every fragment: give it alone"):
        replay_tapes([write(tmp_path / "one.jsonl", records), s0])
    train_tape = write(tmp_path / "vc.jsonl", [{"type": "config", "format": TAPE_FORMAT, "config": {}}, end])
    with pytest.raises(TapeError, match="mix a synchronizer service's and a ddctl train run's"):
        replay_tapes([write(tmp_path / "one.jsonl", records), train_tape])


def run_service(root: Path, *extra: str, link: linkshape.ShapedLink | None = None) -> dict[str, Any]:
    """Two learner processes and the service, over HTTP/2 and TLS, to the end; the service's summary."""
    job = Job.create(root, small_job(learners=2, tokens=40_000, inner_steps=4), host=link.host_ip if link else "127.0.0.1")
    try:
        job.start_syncer("--linger", "30")  # it is asked for its summary after the learners exit; stop_all ends it
        for name in ("L0", "L1"):
            job.start_learner(name, *extra, prefix=link.command() if link else ())
        job.wait_learners()
        return job.wait_for(lambda s: s["job"]["phase"] == "finished", 120, "the job to finish")["job"]["summary"]
    finally:
        job.stop_all()


def replays_to_its_checkpoint(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The service's tape replays to the final model it checkpointed (what ``ddctl pull`` fetches); its updates."""
    tape = Path(summary["state_dir"]) / "tape.jsonl"
    model = load_file(str(Path(summary["checkpoint"]) / "model.safetensors"))
    result = runner.invoke(app, ["replay", str(tape), "--json"])
    assert result.exit_code == 0, result.output
    replayed = json.loads(result.stdout)
    assert replayed["match"] and replayed["params_sha256"] == params_sha256(model) == replayed["recorded_sha256"]
    assert replayed["val_bpb"] == pytest.approx(summary["val_bpb"], abs=1e-5) and replayed["lost_updates"] == 0
    return [r for r in read_tape(tape) if r["type"] == "update"]


@pytest.mark.slow
def test_a_real_services_tape_replays_to_the_model_it_checkpointed(tmp_path: Path) -> None:
    """Three uploads in flight per learner: they may arrive out of order; the replay makes them in order."""
    updates = replays_to_its_checkpoint(run_service(tmp_path, "--parallel-uploads", "3"))
    assert len(updates) > 20


@pytest.mark.slow
@pytest.mark.skipif(linkshape.available() is not None, reason=f"shaping a link needs root and tc: {linkshape.available()}")
def test_updates_absorbed_behind_a_slow_uplink_replay_bit_for_bit(tmp_path: Path) -> None:
    """Both learners behind one 4 Mbit/s uplink (tc tbf): uploads queue, queued updates absorb newer ones of their
    fragment and go out ahead of earlier ones, and the replay still reproduces the model."""
    with linkshape.shaped_link("ddrt", 4.0) as link:
        updates = replays_to_its_checkpoint(run_service(tmp_path, "--parallel-uploads", "1", link=link))
    assert sum(bool(u.get("absorbed")) for u in updates) >= 3, "the slow uplink should have made queued updates absorb"


def test_replay_takes_tapes_or_a_run_and_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path))
    for args in ([], ["some.jsonl", "--run", "r"]):
        refused = runner.invoke(app, ["replay", *args])
        assert refused.exit_code == 2 and "give the run's tapes (TAPE...) or --run RUN, one of the two" in refused.output
    missing = runner.invoke(app, ["replay", "--run", "nowhere"])
    where = tmp_path / "runs" / "nowhere"
    assert missing.exit_code == 2 and "run nowhere has no synchronizer tape" in missing.output
    assert str(where / "job" / "state" / "tape.jsonl") in missing.output and "Traceback" not in missing.output

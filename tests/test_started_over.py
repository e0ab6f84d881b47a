"""A synchronizer that lost its state starts another history; its learners start over from it.

Real processes on loopback for the end-to-end case (a syncer killed and brought back on a fresh state
directory, as a cloud VM replaced with a new disk), and the pieces on their own: the history id kept in
the state directory, the learner's subscriber and uploads noticing, the relay forgetting, the reruns.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ddctl.control.global_checkpoint import take
from ddctl_agents.agent import again
from ddctl_agents.agent.comm import Comms, Identity
from ddctl_agents.agent.routes import Routes
from ddctl_agents.agent.subscription import Subscriber
from ddctl_agents.errors import HTTP, BadRequest, ImpossibleVersion, Refused
from ddctl_agents.relay.feed import Feed
from ddctl_agents.service import history
from ddctl_agents.service.checkpoints import CheckpointPolicy, store
from ddctl_agents.service.publisher import Published, Publisher
from ddctl_agents.service.resume import OWN, job_digest, read_local, starting_point
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checkpoint import MANIFEST, MODEL, encode
from ddctl_agents.waiting import wait_until
from tests.builders import small_run
from tests.service_harness import Job, small_job
from tests.shard_harness import kill_left, start_learner, start_shards, status, wait_finished, wait_learners
from tests.test_checkpoints import _manifest
from tests.test_upload_acks import comms


def test_a_state_directory_keeps_its_history_and_a_fresh_one_starts_another(tmp_path: Path) -> None:
    first = history.of(tmp_path / "state")
    assert history.valid(first) and (tmp_path / "state" / history.FILE).read_text().strip() == first
    assert history.of(tmp_path / "state") == first  # recovered from its state: the same history
    assert history.of(tmp_path / "other") != first  # state gone: another
    (tmp_path / "state" / history.FILE).write_text("not an id\n")
    remade = history.of(tmp_path / "state")
    assert history.valid(remade) and remade != first


@pytest.mark.parametrize("said", ["", "ABCDEF0123456789", "0123", "0123456789abcdef0", "../etc/passwd", "0123456789abcdeg"])
def test_only_sixteen_lowercase_hex_digits_are_a_history(said: str) -> None:
    assert not history.valid(said)


def test_a_source_has_changed_history_only_when_it_names_another_id_than_before() -> None:
    known: dict[str, str] = {}
    assert history.changed(known, "a", "") == "" and known == {}  # names none: nothing is known
    assert history.changed(known, "a", "0123456789abcdef") == ""  # the first
    assert history.changed(known, "a", "0123456789abcdef") == ""  # the same again
    assert history.changed(known, "a", "not an id") == "" and known == {"a": "0123456789abcdef"}
    assert history.changed(known, "a", "00000000000000aa") == "0123456789abcdef"
    assert known == {"a": "0123456789abcdef"}  # the one held: a learner's updates go on naming it until it starts over


@pytest.mark.parametrize(
    ("said", "status"), [("00000000000000aa", 409), ("ABCDEF0123456789", 400), ("../../etc/passwd", 400), ("", 400)]
)
def test_an_update_of_another_history_or_naming_none_as_an_id_is_refused(said: str, status: int) -> None:
    own = "0123456789abcdef"
    history.check(None, own)  # an older learner, or one whose stream has not opened: judged by its base version
    history.check(own, own)
    with pytest.raises((ImpossibleVersion, BadRequest)) as refused:
        history.check(said, own)
    assert HTTP[type(refused.value)][0] == status


def test_a_relays_list_of_its_shards_histories_names_only_the_learners_shards_and_ids() -> None:
    a, b = "0123456789abcdef", "fedcba9876543210"
    urls = ["https://s0:1", "https://s1:1"]
    text = history.listing({"https://s0:1": a, "https://s1:1": b, "https://s2:1": ""})
    assert text == f"https://s0:1={a},https://s1:1={b}" and history.listed(text, urls) == dict(zip(urls, (a, b), strict=True))
    assert history.listed(f"https://elsewhere:1={a},https://s1:1=../../etc", urls) == {}  # not its shard; not an id
    assert history.listed(f"https://s0:1={a}," * 3, urls) == {"https://s0:1": a}  # past as many entries as shards: cut
    assert history.listed("x" * 5000 + f",https://s0:1={a}", urls) == {}  # longer than shards' entries can be
    assert history.listed("", urls) == {} and history.listed("=,=", urls) == {}


class _Counted:
    def came_down(self, nbytes: int) -> None:
        pass


def _subscriber() -> Subscriber:
    return Subscriber(lambda url: None, 1, threading.Event(), lambda url: None, _Counted())  # type: ignore[arg-type,return-value]


def test_a_learner_notices_a_shard_whose_stream_names_another_history() -> None:
    sub = _subscriber()
    sub._opened("https://a:1", "")  # an older syncer names none: nothing is known, nothing happens
    sub._opened("https://a:1", "x" * 16)  # not an id: ignored
    sub._opened("https://a:1", "0123456789abcdef")
    sub._opened("https://b:1", "fedcba9876543210")  # another shard, its own history
    sub._opened("https://a:1", "0123456789abcdef")  # reconnected to the same history (recovered from its state)
    assert not sub.started_over.is_set()
    sub._opened("https://a:1", "00000000000000aa")
    assert sub.started_over.is_set()
    assert "https://a:1 started over" in sub.why_over and "00000000000000aa" in sub.why_over
    assert sub.histories["https://a:1"] == "0123456789abcdef"  # its updates and heartbeats name the one it holds
    sub.lost("a later reason")
    assert "a:1" in sub.why_over  # the first reason is kept


def test_reruns_while_the_synchronizer_started_over_and_not_past_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    reasons = iter([again.STARTED_OVER, again.STARTED_OVER, "finished"])
    runs: list[int] = []

    def run(restarts: int) -> dict[str, Any]:
        runs.append(restarts)
        return {"reason": next(reasons), "restarts": restarts}

    assert again.rerun_summaries(run, lambda: False) == {"reason": "finished", "restarts": 2}
    assert runs == [0, 1, 2]
    forever = again.rerun_summaries(lambda n: {"reason": again.STARTED_OVER, "restarts": n}, lambda: False)
    assert forever["restarts"] == again.MOST_RESTARTS and again.exit_code(forever) == again.EXIT_RESTART
    stopped = again.rerun_summaries(lambda n: {"reason": again.STARTED_OVER, "restarts": n}, lambda: True)
    assert stopped["restarts"] == 0  # a stop (SIGTERM, a notice) is never overridden by a rerun
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank under torchrun: the launcher reruns the ranks
    assert again.rerun_summaries(lambda n: {"reason": again.STARTED_OVER, "restarts": n}, lambda: False)["restarts"] == 0
    codes = iter([again.EXIT_RESTART, 0])
    assert again.rerun_codes(lambda: next(codes)) == 0
    assert again.rerun_codes(lambda: again.EXIT_RESTART) == again.EXIT_RESTART
    assert [again.exit_code({"reason": r}) for r in ("finished", "syncer_gone", again.STARTED_OVER)] == [0, 6, 75]


def test_a_life_that_ends_unheard_does_not_wait_for_its_streams() -> None:
    """A stream ends at its next frame or keep-alive (5 s): the next life, or the exit, does not wait for it (the
    restart took 5.3 s from the syncer's return to training, 5.0 s of it this wait)."""
    c, release = comms(), threading.Event()
    stream = threading.Thread(target=release.wait, args=(30.0,), daemon=True)
    stream.start()
    c._streams.append(stream)
    started = time.monotonic()
    c.close(reason=None)
    assert time.monotonic() - started < 4.0 and stream.is_alive() and c.stopping.is_set()  # not the join's 5 s
    release.set()


def test_a_heartbeat_names_the_shards_history_and_one_refused_for_it_starts_the_learner_over() -> None:
    """Before it notices, a learner's heartbeats of its old life would move the new history's record of its step on
    (and with it where its data starts again): they name their history, and one refused for it is a notice."""

    class Refusing:
        def __init__(self) -> None:
            self.named: list[str] = []

        def heartbeat(self, report: dict[str, Any], based_in: str = "") -> dict[str, Any]:
            self.named.append(based_in)
            raise Refused(409, "impossible_version", "the heartbeat's history is 0123456789abcdef, this one's 00000000000000aa")

        def close(self) -> None:
            pass

    url, client = "http://127.0.0.1:9", Refusing()
    c = Comms(lambda u: client, Routes({"": url}), Identity(name="L0", incarnation=1, region="r"), "fp32", 64, interval_s=0.01)  # type: ignore[arg-type,return-value]
    c.report = {"step": 5}
    c.subscriber._opened(url, "0123456789abcdef")
    beating = threading.Thread(target=c._heartbeat_loop, args=(url,), daemon=True)
    beating.start()
    try:
        assert c.subscriber.started_over.wait(timeout=10)
    finally:
        c.stopping.set()
    beating.join(timeout=5)
    assert client.named[0] == "0123456789abcdef" and "refused a heartbeat" in c.subscriber.why_over


def test_a_learner_knows_each_shards_history_from_its_registration_and_another_there_is_a_start_over() -> None:
    """The registration answer names the shard's history, so a learner knows it first-hand before any stream opens (a
    relay's list must agree with it: ``test_relay_histories``). Registered again (the shard forgot the learner) under
    another history, that shard started over; an answer naming none, or no id, leaves what is known as it is."""

    class Registering:
        def __init__(self) -> None:
            self.said: object = "0123456789abcdef"

        def register(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"learner": "L0", "start_step": 0, "history": self.said}

        def close(self) -> None:
            pass

    url, client = "http://127.0.0.1:9", Registering()
    c = Comms(lambda u: client, Routes({"": url}), Identity(name="L0", incarnation=1, region="r"), "fp32", 64)  # type: ignore[arg-type,return-value]
    assert c._register(url)["history"] == "0123456789abcdef"
    assert c.subscriber.histories == {url: "0123456789abcdef"}
    for bad in ("", "X" * 16, "0123456789abcdef0", 7, None, ["0123456789abcdef"]):
        client.said = bad
        c._reregister(client, url)  # type: ignore[arg-type]
    assert not c.subscriber.started_over.is_set() and c.subscriber.histories == {url: "0123456789abcdef"}
    client.said = "00000000000000aa"
    c._reregister(client, url)  # type: ignore[arg-type]
    assert c.subscriber.started_over.is_set() and "00000000000000aa" in c.subscriber.why_over
    assert c.subscriber.histories == {url: "0123456789abcdef"}  # this life's updates go on naming the one it holds


def test_a_relay_forgets_what_it_holds_when_a_shard_started_over() -> None:
    async def scenario() -> tuple[list[int], list[int], int]:
        publisher = Publisher(2)
        await publisher.publish(Published(fragment=0, version=7, frame=b"x"))
        await publisher.publish(Published(fragment=1, version=9, frame=b"y"))
        feed = Feed(["https://a:1"], lambda url: None, publisher, 2, 30.0)  # type: ignore[arg-type,return-value]
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(feed._opened, "https://a:1", loop, "0123456789abcdef")
        await asyncio.to_thread(feed._opened, "https://a:1", loop, "")  # names none: nothing changes
        held = publisher.versions()
        await asyncio.to_thread(feed._opened, "https://a:1", loop, "00000000000000aa")
        await publisher.publish(Published(fragment=0, version=1, frame=b"z"))  # the new history's, lower numbered
        return held, publisher.versions(), feed.forgotten

    held, after, forgotten = asyncio.run(scenario())
    assert held == [7, 9] and after == [1, -1] and forgotten == 1


def test_a_new_state_directory_starts_from_the_runs_newest_checkpoint_that_reads_whole(tmp_path: Path) -> None:
    assembly = Assembly.build(small_run(learners=2))
    sha = job_digest(assembly.config)
    bucket, state = tmp_path / "bucket", tmp_path / "state"
    policy = CheckpointPolicy(url=str(bucket), keep_last=5)

    def checkpoint(**manifest: Any) -> None:
        store(tmp_path / "local", encode(assembly.initial, None, _manifest(assembly, job_sha256=sha, **manifest)), policy)

    given = tmp_path / "given"
    assert starting_point(state, str(bucket), given, "r", assembly.config) == given  # nothing there yet
    checkpoint(versions=[3, 3, 2, 2])
    checkpoint(versions=[5, 5, 4, 4])
    checkpoint(versions=[6, 6, 6, 6], run="another")  # the same bucket, another run's: never a start
    checkpoint(versions=[7, 7, 7, 7])
    (bucket / "ckpt-000004" / MODEL).write_bytes(b"damaged")  # the newest does not read whole
    assert starting_point(state, str(bucket), given, "r", assembly.config) == state / OWN
    assert read_local(state / OWN, assembly).manifest.versions == [5, 5, 4, 4]
    shutil.rmtree(bucket)
    assert starting_point(state, str(bucket), given, "r", assembly.config) == state / OWN  # kept: every recovery's start
    used = tmp_path / "used"
    (used / "wal").mkdir(parents=True)
    assert starting_point(used, str(bucket), given, "r", assembly.config) == given  # a state of its own: recovered
    assert starting_point(tmp_path / "fresh", "", None, "r", assembly.config) is None  # no checkpoints: the initial model


@pytest.mark.parametrize(
    "index",
    [
        b"not json",
        b"\xff\xfe",
        b"[" * 200_000,  # nested past the parser's depth: RecursionError, not ValueError
        b"[]",
        b'{"checkpoints": 5}',
        b'{"checkpoints": [{"name": "../../etc"}, {"name": 5}, "ckpt-000001"]}',
    ],
)
def test_an_index_that_lists_no_checkpoint_is_no_start(tmp_path: Path, index: bytes) -> None:
    assembly = Assembly.build(small_run(learners=2))
    (tmp_path / "bucket").mkdir()
    (tmp_path / "bucket" / "index.json").write_bytes(index)
    assert starting_point(tmp_path / "state", str(tmp_path / "bucket"), None, "r", assembly.config) is None
    assert not (tmp_path / "state").exists()


@pytest.mark.slow
def test_a_syncer_that_lost_its_state_gets_its_learners_back(tmp_path: Path) -> None:
    """Killed and brought back on a fresh state directory (a cloud VM replaced, its disk new), the syncer starts over
    from the run's newest checkpoint in object storage, at its versions. The learner held later versions: without
    starting over itself, every update it sent would be refused for ever (409 impossible_version) and nothing it
    trained would reach the model."""
    job = Job.create(tmp_path, small_job(learners=1, tokens=400_000))
    try:
        checkpoints = ("--checkpoint-url", str(tmp_path / "bucket"), "--checkpoint-every-rounds", "2")
        job.start_syncer(*checkpoints)
        learner = job.start_learner("L0")
        index = tmp_path / "bucket" / "index.json"
        taken = lambda: len(json.loads(index.read_text())["checkpoints"]) if index.is_file() else 0  # noqa: E731
        before = job.wait_for(lambda s: s["rounds"] >= 4 and taken() >= 2, 180, "checkpoints in the first history")
        job.local.kill()
        shutil.rmtree(job.job_dir / "state")
        job.start_syncer(*checkpoints)
        resumed = job.status()["versions"]  # the checkpoint's, or past them: an old update based on one merges
        after = job.wait_for(lambda s: s["ledger"]["merged"] > 0 and s["rounds"] >= 2, 180, "the learner merged again")
        assert learner.wait(timeout=300) == 0, job.log("L0")[-3000:]
    finally:
        job.stop_all()
    lives = [json.loads(line) for line in job.summary_path("L0").with_suffix(".history.jsonl").read_text().splitlines()]
    assert [life["reason"] for life in lives] == [again.STARTED_OVER, "finished"]
    assert lives[0]["rejected_tokens"] > 0 or "started over" in job.log("L0")
    final = job.summary("L0")
    assert final["restarts"] == 1 and final["drained"]
    assert final["incarnation"] != lives[0]["incarnation"]  # registered again, as a fresh learner of the new history
    started = json.loads((job.job_dir / "state" / OWN / MANIFEST).read_text())  # the checkpoint it started from
    assert started["rounds"] >= 2 and sum(started["versions"]) > 0  # a checkpoint past the initial model
    assert all(now >= then for now, then in zip(resumed, started["versions"], strict=True))  # served from there on
    # its data starts again where the checkpoint had it: its old life's heartbeats name their history and are refused,
    # so none moved the new history's record of its step on (until they did, it went on from where it had come to)
    assert final["start_step"] == started["steps"]["L0"] > 0
    assert before["rounds"] >= 4 and after["ledger"]["merged"] > 0  # the new history's rounds took its updates


@pytest.mark.slow
def test_a_shard_that_lost_its_state_starts_from_the_runs_newest_global_checkpoint(tmp_path: Path) -> None:
    """A shard writes no checkpoint of its own: brought back on a fresh state directory with ``--resume-url`` (what the
    controller gives a shard where the run keeps checkpoints), it serves its fragments of the newest global one, and
    the learners, seeing its new history, start over and train the job to its end with both shards."""
    shards = start_shards(tmp_path, tokens=400_000)
    learners: dict[str, subprocess.Popen[bytes]] = {}
    try:
        learners = {name: start_learner(tmp_path, shards, name) for name in ("L0", "L1")}
        wait_until(lambda: all(status(s)["rounds"] >= 3 for s in shards), timeout_s=180, what="rounds on both shards")
        taken = take([s.url for s in shards], shards[0].connector(), tmp_path / "global")
        files = {p.name: p.read_bytes() for p in (tmp_path / "global").iterdir()}
        store(tmp_path / "controller", {**{n: d for n, d in files.items() if n != MANIFEST}, MANIFEST: files[MANIFEST]},
              CheckpointPolicy(url=str(tmp_path / "bucket")))  # fmt: skip
        shards[1].kill()
        shutil.rmtree(shards[1].root / "state")
        shards[1].start("--shard-map", str(shards[1].job_dir / "shards.json"), "--shard", "S1", "--state-dir",
                        str(shards[1].root / "state"), "--linger", "60", "--resume-url", str(tmp_path / "bucket"))  # fmt: skip
        wait_learners(tmp_path, learners)
        finished = wait_finished(shards)
    finally:
        kill_left(learners)
        for shard in shards:
            shard.kill()
    started = json.loads((shards[1].root / "state" / OWN / MANIFEST).read_text())
    assert started["cut"] == taken["cut"] and started["part"] is None  # the whole global checkpoint, joined
    for name in ("L0", "L1"):
        lives = [json.loads(line) for line in (tmp_path / f"{name}.summary.history.jsonl").read_text().splitlines()]
        assert [life["reason"] for life in lives] == [again.STARTED_OVER, "finished"], name
    assert all(s["job"]["phase"] == "finished" for s in finished)

"""One learner over several ranks (torchrun, gloo on CPU): the same training as one rank, adoptions in lockstep.

A 1-rank learner with batch b and a 2-rank learner with b/2 rows per rank run
against the same deterministic outer step (``tests/rank_worker.py``); DDP and
FSDP2 each must end within ``TOLERANCE`` (2e-4) of the 1-rank parameters (measured:
6.6e-5 for DDP and 5.4e-5 for FSDP2 after 24 steps and 18 adoptions), and every
rank must have adopted the same versions on the same steps.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.service_harness import ENV

ROOT = Path(__file__).resolve().parents[1]
STEPS, BATCH = 24, 8
TOLERANCE = 2e-4
"""Largest absolute difference allowed between 1-rank and 2-rank parameters (values are O(1)): fp32 sums
taken in another order, amplified a little by AdamW's normalisation over 24 steps."""


def _run(out: Path, ranks: int, *extra: str) -> dict[str, Any]:
    env = {**ENV, "PYTHONPATH": f"{ROOT}:{ROOT / 'agents'}"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    worker = [str(ROOT / "tests" / "rank_worker.py"), str(out), "--batch", str(BATCH), "--steps", str(STEPS), *extra]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks > 1 else []
    done = subprocess.run([sys.executable, *launcher, *worker], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {
        "params": torch.load(out / "params.pt"),
        "ranks": [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)],
    }


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(tmp_path_factory.mktemp("one"), 1)


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[name] - b[name]).abs().max().item() for name in a)


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_ranks_with_half_the_rows_train_as_one_rank_with_the_whole_batch(
    one_rank: dict[str, Any], tmp_path: Path, mode: str
) -> None:
    two = _run(tmp_path, 2, *(["--shard"] if mode == "fsdp2" else []))
    reference = one_rank["ranks"][0]
    adoptions = reference["adoptions"]
    assert len(adoptions) >= 4 + 3 * 4  # the bootstrap of 4 fragments, then each fragment adopted 3 times or more
    assert all(rank["adoptions"] == adoptions for rank in two["ranks"])  # same versions, same steps, every rank
    difference = _max_difference(one_rank["params"], two["params"])
    assert difference < TOLERANCE, difference
    moved = _max_difference(one_rank["params"], _run_free_reference_params(one_rank))
    assert moved > 50 * TOLERANCE  # training moved the parameters far more than the ranks disagree
    leader = two["ranks"][0]
    assert leader["trained"] == reference["trained"] == STEPS * BATCH * 128 * 4  # steps x batch x seq_len x fragments
    assert leader["sent_tokens"] == reference["sent_tokens"] > 0  # the learner's tokens, counted once


@pytest.mark.slow
@pytest.mark.parametrize(("example", "mode"), [("hf_model.py", "fsdp2"), ("tiny_rnn.py", "ddp")])
def test_a_model_of_your_own_trains_on_two_ranks_as_on_one(tmp_path: Path, example: str, mode: str) -> None:
    """FSDP2 shards the HF example per block (its ``blocks``), DDP replicates the GRU: both as one rank trains."""
    model = ["--model", f"{ROOT / 'docs' / 'examples' / example}:build"]
    one = _run(tmp_path / "one", 1, *model)
    two = _run(tmp_path / "two", 2, *model, *(["--shard"] if mode == "fsdp2" else []))
    assert all(rank["adoptions"] == one["ranks"][0]["adoptions"] for rank in two["ranks"])
    assert _max_difference(one["params"], two["params"]) < TOLERANCE


def _run_free_reference_params(one_rank: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The seed's initial parameters: what the comparison would be against had nothing trained."""
    from ddctl_agents.train.model import build_model
    from ddctl_agents.train.presets import get_preset

    model = build_model(get_preset("tiny"), seed=0)
    return {name: p.detach() for name, p in model.named_parameters()}


def test_a_learner_relaunches_itself_under_torchrun_without_its_launch_flags() -> None:
    from ddctl_agents.agent.launch import rank_argv, torchrun_command

    assert rank_argv(["--name", "L0", "--gpus", "2", "--syncer", "u"]) == ["--name", "L0", "--syncer", "u"]
    assert rank_argv(["--gpus=4", "--nodes", "2", "--rendezvous=h:1", "--compile"]) == ["--compile"]
    one = torchrun_command(4, 1, "", "ddctl-L0", ["--name", "L0", "--gpus", "4"])
    assert one[1:] == ["-m", "torch.distributed.run", "--nproc-per-node=4", "--max-restarts=0", "--standalone"] + [
        "-m", "ddctl_agents.agent", "--name", "L0"
    ]  # fmt: skip
    spread = torchrun_command(2, 3, "10.0.0.5:29400", "ddctl-L0", [])
    assert "--nnodes=3" in spread and "--rdzv-endpoint=10.0.0.5:29400" in spread and "--rdzv-backend=c10d" in spread
    assert not any(arg.startswith("--local-addr") for arg in spread)  # unknown: torchrun's hostname
    told = torchrun_command(2, 3, "10.0.0.5:29400", "ddctl-L0", [], local_addr="10.0.0.7")
    assert "--local-addr=10.0.0.7" in told


def test_a_node_names_its_address_on_the_route_to_the_rendezvous_or_from_its_host_to_the_syncer() -> None:
    """The other nodes meet rank 0's node at this address, not at a hostname they may not resolve."""
    from ddctl_agents.agent.launch import own_address

    assert own_address("127.0.0.1:29400", "https://127.0.0.1:8443") == "127.0.0.1"  # the host: toward the syncer
    toward = own_address("203.0.113.9:29400", "https://127.0.0.1:8443")  # a node: toward the host, not the syncer
    assert toward and not ipaddress.ip_address(toward).is_loopback
    with socket.socket() as mine:
        mine.bind((toward, 0))  # one of this machine's own addresses
    assert own_address("127.0.0.1:29400", "https://203.0.113.9:8443") == toward  # the host: toward the syncer
    assert own_address("no-such-host.invalid:29400", "https://x:1") == ""  # unresolvable: torchrun's hostname


@pytest.mark.parametrize(
    ("gpus", "nodes", "rendezvous", "message"),
    [
        (0, 1, "", "--gpus must be in [1, 64], got 0"),
        (1, 65, "", "--nodes must be in [1, 64], got 65"),
        (1, 2, "", "--nodes 2 needs --rendezvous HOST:PORT (one of the nodes), got ''"),
        (1, 2, "host:70000", "needs --rendezvous HOST:PORT"),
        (1, 2, "host;rm -rf:1", "needs --rendezvous HOST:PORT"),
    ],
)
def test_a_bad_launch_is_refused_naming_the_flag(gpus: int, nodes: int, rendezvous: str, message: str) -> None:
    from ddctl_agents.agent.launch import torchrun_command
    from ddctl_agents.errors import AgentError

    with pytest.raises(AgentError, match=re.escape(message)):
        torchrun_command(gpus, nodes, rendezvous, "ddctl-L0", [])


def test_a_bad_gpus_value_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    from ddctl_agents.agent.run import main

    assert main(["--syncer", "http://127.0.0.1:9", "--name", "L0", "--token", "t", "--gpus", "0"]) == 2
    assert "--gpus must be in [1, 64], got 0" in capsys.readouterr().err
    assert os.environ.get("WORLD_SIZE") is None


@pytest.mark.slow
def test_a_two_rank_learner_trains_beside_one_rank_learners_against_the_real_syncer(tmp_path: Path) -> None:
    from tests.service_harness import Job, small_job

    job = Job.create(tmp_path, small_job(learners=3, tokens=150_000))
    try:
        job.start_syncer()
        job.start_learner("L0", "--gpus", "2")
        job.start_learner("L1")
        job.start_learner("L2")
        seen = job.wait_for(
            lambda s: any(e["id"] == "L0" and e["devices"] == 2 for e in s["learners"]), 180, "L0's heartbeat from 2 ranks"
        )
        l0 = next(e for e in seen["learners"] if e["id"] == "L0")
        assert l0["accelerator"] == "cpu" and l0["mfu"] is None  # a CPU has no bf16 peak in the table
        job.wait_learners()
        status = job.wait_for(lambda s: s["ledger"]["pending"] == 0, 60, "the last rounds to close")
    finally:
        job.stop_all()
    summaries = {name: job.summary(name) for name in ("L0", "L1", "L2")}
    assert all(s["drained"] and s["reason"] == "finished" for s in summaries.values())
    assert [s["devices"] for s in summaries.values()] == [2, 1, 1]
    ledger = status["ledger"]
    assert ledger["balanced"] and ledger["received"] == sum(sum(s["acked_tokens"].values()) for s in summaries.values())
    tokens_per_step, fragments = 8 * 128, 4
    for name, s in summaries.items():  # every learner, the 2-rank one included, trained its batch once per step
        assert s["trained_tokens"] == (s["step"] - s["start_step"]) * tokens_per_step * fragments, name
        assert next(e for e in status["learners"] if e["id"] == name)["tokens"] == s["trained_tokens"] // fragments
    assert "Traceback" not in job.log("L0")  # both ranks ended cleanly


@pytest.mark.slow
def test_a_learner_spanning_two_machines_meets_at_a_c10d_rendezvous_and_is_one_learner(tmp_path: Path) -> None:
    """Two processes stand for two VMs of one region: the same command line on each, one rendezvous endpoint."""
    import socket

    from tests.service_harness import Job, small_job

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = Job.create(tmp_path, small_job(learners=2, tokens=60_000))
    try:
        job.start_syncer()
        spread = ("--nodes", "2", "--rendezvous", f"127.0.0.1:{port}")
        first = job.start_learner("L0", *spread)
        second_summary = tmp_path / "L0-node-b.summary.json"
        command = [sys.executable, "-m", "ddctl_agents.agent", "--syncer", job.url, "--name", "L0", "--token", job.token("L0")]
        command += ["--ca", str(job.job_dir / "tls" / "ca.pem"), "--summary", str(second_summary), *spread]
        with (tmp_path / "L0-node-b.log").open("ab") as log:
            second = subprocess.Popen(command, stdout=log, stderr=log, env=ENV)
        job.start_learner("L1")
        assert [first.wait(timeout=300), second.wait(timeout=60), job.learners["L1"].wait(timeout=60)] == [0, 0, 0]
        status = job.wait_for(lambda s: s["ledger"]["pending"] == 0, 60, "the last rounds to close")
    finally:
        job.stop_all()
    leader_summaries = [p for p in (job.summary_path("L0"), second_summary) if p.exists()]
    assert len(leader_summaries) == 1  # one leader, whichever node torchrun gave rank 0
    summary = json.loads(leader_summaries[0].read_text())
    assert summary["devices"] == 2 and summary["reason"] == "finished" and summary["drained"]
    l0 = next(e for e in status["learners"] if e["id"] == "L0")
    assert l0["devices"] == 2 and l0["tokens"] == summary["trained_tokens"] // 4  # its tokens, once
    assert status["ledger"]["balanced"]


@pytest.mark.slow
def test_a_multi_rank_learner_ends_with_its_leaders_exit_code_sigterm_0_and_a_lost_syncer_6(tmp_path: Path) -> None:
    """SIGTERM stops every rank on the leader's decision (exit 0); the dead-man switch ends as unreachable (6),
    where torchrun alone would say 1 for either."""
    import signal

    from tests.service_harness import Job, small_job

    job = Job.create(tmp_path, small_job(learners=2, tokens=400_000))
    try:
        job.start_syncer()
        stopped = job.start_learner("L0", "--gpus", "2")
        stranded = job.start_learner("L1", "--gpus", "2", "--syncer-timeout", "10")
        job.wait_for(lambda s: sum(e["step"] >= 8 for e in s["learners"]) == 2, 180, "both learners training")
        stopped.send_signal(signal.SIGTERM)  # as a preemption or `ddctl down` sends it
        assert stopped.wait(timeout=120) == 0, job.log("L0")[-3000:]
        job.wait_for(lambda s: s["ledger"]["pending"] == 0, 60, "L0's last updates merged")
        assert job.syncer is not None
        job.kill(job.syncer)  # gone for good
        assert stranded.wait(timeout=120) == 6, job.log("L1")[-3000:]
    finally:
        job.stop_all()
    summary = job.summary("L0")
    assert summary["reason"] == "sigterm" and summary["drained"] and summary["unsent_tokens"] == 0
    assert summary["step"] < 100  # it stopped early: its budget is 400,000 / (2 x 8 x 128) = 195 steps
    assert "Traceback" not in job.log("L0")
    assert job.summary("L1")["reason"] == "syncer_gone"

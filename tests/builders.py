"""Shared builders for tests: small syncers, updates and run configs."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from ddctl.config.train import ClusterConfig, TrainConfig
from ddctl.control.controller import Controller
from ddctl.control.state import InstanceRecord, State
from ddctl.providers.base import InstanceSpec
from ddctl.providers.fake import FakeProvider
from ddctl_agents.core.config import SyncerConfig
from ddctl_agents.core.fragments import TensorSpec, fragment_tensors
from ddctl_agents.core.messages import Update
from ddctl_agents.core.quorum import QuorumConfig
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.train.config import DataConfig, InnerConfig, RunBudget, SyncSettings

_ids = itertools.count()


INSTANCE_KINDS = ("learner", "syncer", "controller", "metadata endpoint")


def instances_removed(down_result: dict[str, Any]) -> list[str]:
    """The instances ``ddctl down --json`` reports it removed (its ``removed`` is by kind), sorted."""
    return sorted(name for kind in INSTANCE_KINDS for name in down_result["removed"].get(kind, []))


def small_syncer(quorum: int = 1, grace: bool = False, fragments: int = 2, **kw: object) -> Synchronizer:
    params = {"a": torch.zeros(4), "b": torch.zeros(4), "emb": torch.zeros(2, 2)}
    specs = [TensorSpec(name=k, shape=tuple(v.shape), is_embedding=k == "emb") for k, v in params.items()]
    config = SyncerConfig(quorum=QuorumConfig(quorum=quorum, grace=grace), inner_steps=4, **kw)  # type: ignore[arg-type]
    return Synchronizer(params, fragment_tensors(specs, fragments), frozenset({"emb"}), config)


def update_for(
    syncer: Synchronizer,
    learner: str,
    fragment: int,
    value: float = 1.0,
    base: int | None = None,
    c_steps: int = 4,
    c_tokens: int = 400,
    update_id: str | None = None,
) -> Update:
    tensors = {name: torch.full_like(t, value) for name, t in syncer.fragments[fragment].items()}
    return Update(
        learner=learner,
        fragment=fragment,
        base_version=syncer.versions[fragment] if base is None else base,
        update_id=update_id or f"{learner}.{next(_ids)}",
        step=c_steps,
        c_steps=c_steps,
        c_tokens=c_tokens,
        tensors=tensors,
    )


CORPUS = DataConfig(max_bytes=1 << 20, eval_windows=16)


def small_run(tokens: int = 40_000, learners: int = 2, **kw: object) -> TrainConfig:
    """A run that takes seconds: tiny model, 1 MiB of corpus, few fragments."""
    sync = SyncSettings(
        fragments=4,
        inner_steps=8,
        codec=str(kw.pop("codec", "int4")),
        error_feedback=bool(kw.pop("error_feedback", False)),
        push_before_overwrite=bool(kw.pop("push_before_overwrite", False)),
    )
    syncer = SyncerConfig(quorum=QuorumConfig(quorum=1, grace=bool(kw.pop("grace", True))), inner_steps=8)
    cluster = kw.pop("cluster", ClusterConfig())
    preset = str(kw.pop("preset", "tiny"))
    return TrainConfig(
        inner=InnerConfig(preset=preset, batch_size=4, warmup_steps=5, lr=3e-3),
        data=CORPUS,
        budget=RunBudget(tokens=tokens, learners=learners),
        sync=sync,
        syncer=syncer,
        cluster=cluster,
        **kw,  # type: ignore[arg-type]
    )


def regions_at(tmp_path: Path, monkeypatch: Any, raw: dict[str, Any]) -> Path:
    """``raw`` as tmp_path/regions.yaml, with ddctl's data directory under tmp_path/home (a run's files stay in the test)."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def dry_run_up(regions: Path) -> dict[str, Any]:
    """``ddctl up -f REGIONS --dry-run --json`` through the CLI, which must succeed; its answer."""
    from typer.testing import CliRunner

    from ddctl.cli.app import app

    up = CliRunner().invoke(app, ["up", "-f", str(regions), "--dry-run", "--json"])
    assert up.exit_code == 0, up.output
    return dict(json.loads(up.stdout))


def status_json() -> dict[str, Any]:
    """``ddctl status --json`` through the CLI, which must succeed; its answer."""
    from typer.testing import CliRunner

    from ddctl.cli.app import app

    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def recorded(run: str, kind: str, instance: str) -> list[dict[str, Any]]:
    """The run's ``kind`` events about ``instance`` in the state file, oldest first: ``status`` shows only the newest
    events, and a busy run's checkpoints can push an early one out of its window."""
    from ddctl.control.state import State

    with State() as state:
        return [e for e in state.events(run, 100_000) if e.get("kind") == kind and e.get("instance") == instance]


def every_learner_training(regions: set[str], timeout_s: float = 120.0) -> dict[str, Any]:
    """``ddctl status --json`` once each of ``regions``' learners trains; ``up`` returns on the first merged round.

    One learner's update makes a round (quorum 1), so a slower region's learner may still be registering when ``up``
    returns: shown as deploying (its VM is up), never as anything else.
    """
    from ddctl_agents.waiting import wait_until

    def states(status: dict[str, Any]) -> dict[str, set[str]]:
        return {r["name"]: {learner["state"] for learner in r["learners"]} for r in status["regions"]}

    first = states(status_json())
    assert set(first) == regions and set().union(*first.values()) <= {"deploying", "training"}, first
    return wait_until(
        lambda: s if set().union(*states(s := status_json()).values()) == {"training"} else None,
        timeout_s=timeout_s, every_s=0.5, what="every region's learner training",
    )  # fmt: skip


def run_to_its_end(run: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait (through ``ddctl ls --json``) until ``run`` has finished; ``ddctl status --run RUN --json`` then."""
    from typer.testing import CliRunner

    from ddctl.cli.app import app
    from ddctl_agents.waiting import wait_until

    runner = CliRunner()

    def finished() -> bool:
        listed = runner.invoke(app, ["ls", "--json"])
        assert listed.exit_code == 0, listed.output
        return any(r["run"] == run and r["state"] == "finished" for r in json.loads(listed.stdout)["runs"])

    wait_until(finished, timeout_s=timeout_s, every_s=1.0, what=f"{run} to finish its budget")
    status = runner.invoke(app, ["status", "--run", run, "--json"])
    assert status.exit_code == 0, status.output  # finished: the syncer is gone on purpose, not unreachable
    return dict(json.loads(status.stdout))


def check_finished(status: dict[str, Any], learners: list[str], budget: int) -> dict[str, Any]:
    """What every finished dry run must show: the result, the ``finished`` event, books consistent with the budget."""
    job = status["job"]
    assert job["phase"] == "finished", job
    summary = job["summary"]
    assert summary["reason"] == "every learner trained its share of the token budget"
    assert summary["learners_finished"] == learners
    tokens = summary["tokens"]
    assert tokens["budget"] == budget and tokens["pending"] == 0
    assert tokens["merged"] + tokens["late_merged"] <= tokens["received"] <= tokens["trained"] <= tokens["planned"] <= budget
    assert tokens["trained"] >= 0.9 * tokens["planned"]  # every learner trained (nearly) all of its share
    assert tokens["merged"] + tokens["late_merged"] + tokens["dropped"] + tokens["rejected"] == tokens["received"]
    assert 0 < summary["val_bpb"] < 8 and summary["rounds"] > 0 and summary["result"]
    assert Path(summary["result"], "summary.json").exists()  # the result is where it says, on this machine
    assert any(e.get("event", e.get("kind")) == "finished" for e in status["events"])
    return dict(summary)


def machines_that_would_answer(monkeypatch: Any, provider_module: Any) -> None:
    """A cloud provider's VMs as if they answered: its first-boot wait passes and the deploy is a no-op (no VM boots)."""
    from ddctl.errors import DeployError
    from ddctl.providers import deploy

    monkeypatch.setattr(provider_module, "_ready", lambda target: True)
    monkeypatch.setattr(deploy, "deploy", lambda *args, **kwargs: 4242)

    def no_machine(target: deploy.Target, *args: object, **kwargs: object) -> tuple[int, str, str]:
        raise DeployError(f"no machine answers at {target.host} in these tests", host=target.host)

    monkeypatch.setattr(deploy, "run_command", no_machine)


def syncer_row(run: str, name: str) -> dict[str, Any]:
    """The syncer's own view of a learner (its incarnation, its updates by outcome), asked with the admin token."""
    from ddctl.control.up import admin_client

    client = admin_client(run)
    try:
        return next(row for row in client.status()["learners"] if row["id"] == name)
    finally:
        client.close()


def merged(row: dict[str, Any]) -> int:
    """A learner's updates merged into the model (on time or late)."""
    return int(row["updates"].get("accepted", 0) + row["updates"].get("late", 0))


def decided(row: dict[str, Any]) -> int:
    """A learner's updates the syncer took and decided on: merged, or dropped as based on a version already merged past
    (``max_behind``, 0 by default: a push on a spot notice often is)."""
    return merged(row) + int(row["updates"].get("dropped", 0))


def shard_statuses(run: str) -> list[dict[str, Any]]:
    """Every shard's own status of a sharded run (``RUN/shards.url``), asked with the admin token."""
    from ddctl.control.rundir import RunDir

    return [shard_status(run, url) for url in RunDir(run).urls()]


def shard_status(run: str, url: str) -> dict[str, Any]:
    """One shard's own status, asked with the admin token."""
    from ddctl.control.up import admin_client

    client = admin_client(run, url=url)
    try:
        return dict(client.status())
    finally:
        client.close()


def shards_finished(run: str) -> Callable[[], list[dict[str, Any]] | None]:
    """A wait's condition: every shard's status once each has said its job finished (in the shards' order), else None.

    A shard's finished answer is kept, and a shard that does not answer is asked again at the next look: once the
    last shard finishes, the controller ends the run and removes the shards' machines, which can come between two
    looks (a clean-clone CI run lost a shard's VM that way: "No route to host")."""
    from ddctl.control.rundir import RunDir
    from ddctl_agents.errors import Unavailable

    kept: dict[str, dict[str, Any]] = {}

    def look() -> list[dict[str, Any]] | None:
        urls = RunDir(run).urls()
        for url in (u for u in urls if u not in kept):
            try:
                answer = shard_status(run, url)
            except Unavailable:
                continue
            if answer["job"]["phase"] == "finished":
                kept[url] = answer
        return [kept[url] for url in urls] if len(kept) == len(urls) else None

    return look


def controller_world(tmp_path: Path, run: str, placements: list[dict[str, str]]) -> tuple[State, FakeProvider, Controller]:
    """A training run of one syncer and learners L0, L1 on the fake provider, recorded running, and its controller."""
    state = State(tmp_path / "state.sqlite3")
    state.create_run(run, "regions.yaml", str(tmp_path / "job"), {})
    state.set_run_state(run, "training")
    fake = FakeProvider()
    for name, role in (("syncer", "syncer"), ("L0", "learner"), ("L1", "learner")):
        spec = InstanceSpec(
            run=run, name=name, region="eu", role=role, argv=("agent",), log=tmp_path / f"{name}.log", summary="/s.json"
        )
        started = fake.create(spec)
        detail = {"spec": spec.to_json(), "placements": placements}
        state.put_instance(InstanceRecord(run, name, "eu", "fake", role, "running", started.provider_id, time.time(), detail))
    fake.calls.clear()
    return state, fake, Controller(run, state, owners={"fake": fake})

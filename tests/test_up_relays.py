"""``ddctl up`` runs the plan's relays: a region with several learners at cadence 1 gets one, on its first learner's
machine, and its learners take each version through it (``agent/relay_host.py``, ``control/relays.py``)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control.credentials import relay_token_for
from ddctl.control.rundir import RunDir
from ddctl.control.specs import RELAY_PORT, with_relay
from ddctl.control.state import State
from ddctl.providers.base import Instance, InstanceSpec
from ddctl.providers.docker.engine import engine_unavailable
from ddctl.providers.docker.vms import DockerProvider
from ddctl.providers.process import ProcessProvider
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.relay import server_name
from ddctl_agents.waiting import wait_until
from tests.builders import check_finished, dry_run_up, regions_at, run_to_its_end, status_json
from tests.test_up import REGIONS as UP

runner = CliRunner()
REGIONS: dict[str, Any] = {**UP, "run": "relayed", "training": {**UP["training"], "tokens": 3_000_000}}
"""test_up's regions (west has two learners at cadence 1: the plan gives it a relay), with time to kill its host."""


@pytest.fixture
def regions_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return regions_at(tmp_path, monkeypatch, REGIONS)


def test_the_plan_puts_the_relay_on_the_regions_first_learner(regions_file: Path) -> None:
    result = runner.invoke(app, ["up", "-f", str(regions_file), "--dry-run", "--plan", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert {i["name"]: i["relay"] for i in plan["instances"]} == {"syncer": "", "L0": "", "L1": "host", "L2": "served"}
    assert {row["region"]: row["relay"] for row in plan["synchronizer"]["sites"]} == {"east": False, "west": True}
    shown = runner.invoke(app, ["up", "-f", str(regions_file), "--dry-run", "--plan"])
    hosts = [line.split("│")[1].strip() for line in shown.stdout.splitlines() if "learner + relay" in line]
    assert shown.exit_code == 0 and hosts == ["L1"], shown.stdout


def test_with_relay_points_a_served_learner_at_its_host_and_at_no_host_without_one() -> None:
    argv = (
        "python",
        "-m",
        "ddctl_agents.agent",
        "--relay",
        "https://127.0.0.1:29401",
        "--relay-token-file",
        "/t",
        "--name",
        "L2",
    )
    spec = InstanceSpec(run="r", name="L2", region="west", role="learner", argv=argv, log=Path("/l"))
    assert with_relay(spec, "10.0.0.7").argv[4] == "https://10.0.0.7:29401"
    assert with_relay(spec, "fd00::7").argv[4] == "https://[fd00::7]:29401"
    unknown = with_relay(spec, "")  # its versions come from the shards, which it asks where the relay is
    assert (
        unknown.argv == (*argv[:4], "https://:29401", *argv[5:])
        and with_relay(unknown, "10.0.0.8").argv[4] == "https://10.0.0.8:29401"
    )
    host = InstanceSpec(
        run="r", name="L1", region="west", role="learner", argv=(*argv, "--host-relay", "0.0.0.0:29401"), log=Path("/l")
    )
    assert with_relay(host, "10.0.0.7") == host  # the host reaches its own relay on loopback


def relay_health(run: str, port: int, host: str = "127.0.0.1") -> dict[str, Any] | None:
    """West's relay's health as its learner L2 would ask it (None while nothing answers)."""
    rundir = RunDir(run)
    token = relay_token_for(rundir.job, "west", "L2")
    client = SyncerClient(f"https://{host}:{port}", token, rundir.ca, timeout_s=5.0, server_name=server_name("west"))
    try:
        return client.health()
    except Unavailable:
        return None
    finally:
        client.close()


def serving(run: str, port: int, host: str = "127.0.0.1") -> dict[str, Any] | None:
    """The relay's health once it serves its region's two learners: about twice what it pulls."""
    health = relay_health(run, port, host)
    return health if health is not None and health["bytes_out"] >= 1.6 * health["bytes_in"] > 0 else None


def relay_said(log: str) -> str:
    return log if "the region's relay delivers" in log else ""


def pid_of(run: str, name: str) -> int:
    [instance] = [i for i in ProcessProvider().list_run(run) if i.name == name]
    return int(instance.provider_id)


def behind(count: int, timeout_s: float = 60.0) -> None:
    """Wait until ``ddctl status`` counts ``count`` learners behind west's relay; on a timeout, say what it showed last
    (the relay's feed and each west learner's state): a count that stays short is then told from a learner gone
    quiet (its heartbeats) or one still reading a shard's stream itself."""
    last: list[Any] = []

    def counted() -> bool:
        status = status_json()
        west = [r for r in status.get("regions", []) if r.get("name") == "west"]
        last[:] = [status["relays"].get("west"), [(e["id"], e["state"]) for r in west for e in r["learners"]]]
        return bool(last[0] and last[0]["learners"] == count)

    wait_until(counted, timeout_s=timeout_s, what=f"{count} learners behind west's relay",
               error=lambda message: TimeoutError(f"{message}; last seen: relay {last[0]}, learners {last[1]}"))  # fmt: skip


@pytest.mark.slow
def test_up_runs_the_relay_on_its_host_and_a_killed_host_is_replaced_with_its_relay(regions_file: Path) -> None:
    run = dry_run_up(regions_file)["run"]
    try:
        with State() as state:
            port = int(state.run(run).detail["relay_ports"]["west"])  # type: ignore[union-attr]
        # both west learners read through it: it serves about twice what it pulls, and its shards are fresh
        served = wait_until(lambda: serving(run, port), timeout_s=120, what="the relay to serve both west learners")
        assert served["stale"] == "" and served["refused_in"] == 0
        # ddctl status shows it by its region: the synchronizer's stream to it, and what it sent, read between two
        # readings of what the relay read (training goes on: within a version, 1.1 MB, of the two)
        first = relay_health(run, port)
        feed = status_json()["relays"]["west"]
        health = relay_health(run, port)
        assert first is not None and health is not None and feed["streams"] == 1
        assert first["bytes_in"] - 1_100_000 <= feed["bytes"] <= health["bytes_in"] + 1_100_000, (first, feed, health)
        assert feed["address"] == f"127.0.0.1:{port}"  # where it listens, as it told the synchronizer
        # both west learners read through it, and the synchronizer counts them so (neither reads a stream of its own)
        behind(2)
        logs = RunDir(run).root / "logs"
        for name in ("L1", "L2"):
            wait_until(lambda n=name: "the region's relay delivers" in (logs / f"{n}.log").read_text(), timeout_s=60,
                       what=f"{name} to take versions from the relay")  # fmt: skip
        assert "relay" not in (logs / "L0.log").read_text()  # east has one learner: no relay
        host = pid_of(run, "L1")
        os.kill(host, signal.SIGKILL)  # the relay is its child: it ends with it
        wait_until(lambda: relay_health(run, port) is None, timeout_s=30, what="the relay to end with its host")
        wait_until(lambda: status_json()["relays"]["west"]["streams"] == 0, timeout_s=30, what="status to say it is down")
        wait_until(lambda: "pulling from the shards until it is back" in (logs / "L2.log").read_text(), timeout_s=60,
                   what="L2 to fall back to the shards")  # fmt: skip
        # the controller replaces L1, which hosts the relay again on the run's port; L2 goes back to it
        again = wait_until(lambda: (h := relay_health(run, port)) and h["bytes_out"] > 0 and h, timeout_s=180,
                           what="the replaced host's relay to serve")  # fmt: skip
        assert pid_of(run, "L1") != host and again["stale"] == ""
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output
    assert ProcessProvider().list_run(run) == []
    for name in ("L1", "L2"):  # the relay stopped twice (its host killed, then down): it ended its streams first
        assert "Traceback" not in (logs / f"{name}.log").read_text(), name


@pytest.mark.slow
@pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}")
def test_on_docker_vms_the_served_learner_reaches_the_relay_at_its_hosts_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remote path: the relay's files are deployed to its host's VM over SSH, it listens on every interface, and the
    other learner is pointed at the host VM's private address before it starts."""
    regions = {**REGIONS, "run": "relayed-vms", "regions": [{**r, "provider": "docker"} for r in REGIONS["regions"]]}
    run = dry_run_up(regions_at(tmp_path, monkeypatch, regions))["run"]
    try:
        [host] = [i for i in DockerProvider().list_run(run) if i.name == "L1"]
        with State() as state:
            [record] = [r for r in state.instances(run) if r.name == "L2"]
        served = InstanceSpec.from_json(record.detail["spec"])
        at = served.argv.index("--relay")
        assert served.argv[at + 1] == f"https://{host.private_address}:{RELAY_PORT}" and "--host-relay" not in served.argv
        address = host.private_address
        health = wait_until(lambda: serving(run, RELAY_PORT, address), timeout_s=180, what="the relay to serve both learners")
        assert health["stale"] == "" and health["refused_in"] == 0
        logs = wait_until(lambda: relay_said(runner.invoke(app, ["logs", "L2"]).output), timeout_s=60, what="L2 to use the relay")
        assert "pulling from the shards" not in logs
        # the relay found its own address (its route to the synchronizer) and told it: the one L2 was given
        assert status_json()["relays"]["west"]["address"] == f"{address}:{RELAY_PORT}"
        # its host's VM dies; the controller's replacement is another VM at another address, as on a cloud, whose
        # relay tells the synchronizer where it is; L2, started before it and never restarted, moves to it
        DockerProvider().engine.kill(host.provider_id)
        new = wait_until(lambda: replaced(run, host.provider_id), timeout_s=240, what="the controller to replace L1")
        assert new.private_address != address
        wait_until(lambda: status_json()["relays"]["west"]["address"] == f"{new.private_address}:{RELAY_PORT}",
                   timeout_s=120, what="the replaced host's relay to tell the synchronizer where it is")  # fmt: skip
        again = wait_until(lambda: serving(run, RELAY_PORT, new.private_address), timeout_s=120, what="it to serve both")
        assert again["stale"] == ""
        moved = f"the region's relay is now at https://{new.private_address}:{RELAY_PORT} (it was at https://{address}:"
        assert moved in runner.invoke(app, ["logs", "L2"]).output
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output


def replaced(run: str, old: str) -> Instance | None:
    """The live L1 that is not VM ``old`` (None until one runs)."""
    return next((i for i in DockerProvider().list_run(run) if i.name == "L1" and i.alive and i.provider_id != old), None)


@pytest.mark.slow
def test_a_relayed_run_finishes_its_budget_and_no_finished_learner_is_started_again(regions_file: Path) -> None:
    """To the end: the learners finish one by one while the synchronizer waits for the last, and a finished process is
    not listed; its summary here says it is done, so the controller starts no learner again (``_left_finished``)."""
    budget = 300_000
    regions_file.write_text(yaml.safe_dump({**REGIONS, "training": {**REGIONS["training"], "tokens": budget}}))
    run = dry_run_up(regions_file)["run"]
    try:
        summary = check_finished(run_to_its_end(run), ["L0", "L1", "L2"], budget)
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
    assert down.exit_code == 0, down.output
    with State() as state:
        replaced = [e for e in state.events(run, 1000) if e.get("kind") == "replaced"]
    assert replaced == [] and summary["rounds"] > 0
    for name in ("L0", "L1", "L2"):  # each summary is its learner's own, not a second life's that trained nothing
        own = json.loads(RunDir(run).summary(name).read_text())
        assert own["reason"] == "finished" and own["trained_tokens"] > 0, own

"""``ddctl up --dry-run`` with Docker regions: VMs deployed over SSH, shaped links, spot notices, ``down``.

Needs a Docker engine and root (tc in the containers' namespaces); `.ci/run`
installs Debian's docker.io and starts dockerd, so these run in CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.errors import UnreachableError
from ddctl.providers import deploy, linkshape
from ddctl.providers.base import RUN_LABEL
from ddctl.providers.docker.engine import Engine, engine_unavailable
from ddctl.providers.docker.vms import DockerProvider
from ddctl_agents.waiting import wait_until
from tests.builders import dry_run_up, instances_removed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}"),
    pytest.mark.skipif(linkshape.available() is not None, reason=f"{linkshape.available()}"),
]
runner = CliRunner()
RATES = {"fast": 200, "mid": 50, "slow": 12}


def _regions(tmp_path: Path) -> Path:
    regions = {
        "run": "dock",
        "syncer": "fast",
        # one ~0.6 MB update per send, long enough to time on every link
        "training": {"preset": "tiny", "tokens": 4_000_000, "fragments": 1, "inner_steps": 8, "max_bytes": 1 << 21},
        "regions": [
            {"name": name, "provider": "docker", "learners": 1, "link": {"up_mbps": rate, "down_mbps": rate}}
            for name, rate in RATES.items()
        ],
    }
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump(regions))
    return path


def _status() -> dict[str, Any]:
    result = runner.invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_docker_regions_train_shaped_survive_a_preemption_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    started = dry_run_up(_regions(tmp_path))
    run = started["run"]
    assert started["provider"] == "docker" and started["rounds"] >= 1
    engine = Engine()
    try:
        containers = engine.containers({RUN_LABEL: run})
        assert sorted(c["Labels"]["ddctl-name"] for c in containers) == ["L0", "L1", "L2", "syncer"]
        assert len(engine.networks({RUN_LABEL: run})) == 3

        # every learner trains, and the links measure as they were shaped
        seen: list[dict[str, dict[str, float]]] = []

        def measured() -> dict[str, dict[str, float]] | None:  # the EWMA's first samples on a busy machine are noisy
            status = _status()
            rows = {r["name"]: r["learners"][0] for r in status["regions"]}
            if not all(row["up_mbps"] and row["down_mbps"] and row["step"] > 0 for row in rows.values()):
                return None
            links = {name: {"up": row["up_mbps"], "down": row["down_mbps"]} for name, row in rows.items()}
            seen.append(links)
            within = all(0.5 * rate <= links[name]["up"] <= 2.0 * rate for name, rate in RATES.items())
            return links if within else None

        try:  # 0.6 MB updates on a busy 2-core machine: uplinks within 2x
            links = wait_until(measured, timeout_s=180, every_s=0.5, what="every uplink to measure within 2x of its rate")
        except TimeoutError:
            pytest.fail(f"uplinks never measured within 2x of {RATES}: {seen[-3:]}")
        for direction in ("up", "down"):
            assert links["fast"][direction] > links["mid"][direction] > links["slow"][direction], links

        # the machine is reachable over SSH with the run's key, and its link is shaped inside it
        shell = runner.invoke(app, ["ssh", "mid", "--", "tc", "qdisc", "show", "dev", "eth0"])
        assert shell.exit_code == 0, shell.output
        assert "tbf" in shell.stdout and "50Mbit" in shell.stdout
        logs = runner.invoke(app, ["logs", "mid"])  # a running VM's log, read over SSH
        assert logs.exit_code == 0 and "ddctl_agents.agent.progress INFO step " in logs.output, logs.output
        [mid] = [i for i in DockerProvider().list_run(run) if i.name == "L1"]
        target = DockerProvider().ssh_target(mid)
        wrong = deploy.Target(target.host, deploy.new_keypair()[1], target.client_key)
        with pytest.raises(UnreachableError, match="does not match the pinned one"):
            deploy.run_command(wrong, "true")

        # a network partition: the slow region is cut off from the syncer; the others keep merging at K=1,
        # its learner keeps training on the same VM and rejoins on its own; nothing is applied twice
        _partition_and_heal(run, engine)

        # a spot notice through the metadata endpoint: early push, the job keeps merging, a replacement rejoins
        rounds = _status()["rounds"]
        chaos = runner.invoke(app, ["chaos", "preempt", "mid", "--notice", "20", "--json"])
        assert chaos.exit_code == 0, chaos.output
        assert json.loads(chaos.stdout)["seconds_to_exit"] < 20  # it left on the notice, before the kill
        log = tmp_path / "home" / "runs" / run / "logs" / "L1.log"
        summary = wait_until(lambda: _first_summary(log), timeout_s=30, every_s=0.5, what="the preempted VM's log is collected")
        assert summary["reason"] == "preemption_notice" and summary["drained"]
        assert sum(summary["acked_tokens"].values()) == summary["sent_tokens"] > 0

        def rejoined() -> bool:
            status = _status()
            row = next(r["learners"][0] for r in status["regions"] if r["name"] == "mid")
            return bool(status["rounds"] > rounds and row["state"] == "training" and row["step"] > summary["step"])

        wait_until(rejoined, timeout_s=120, every_s=0.5, what="the replacement VM rejoins and the job keeps merging")
        replacement = next(c for c in engine.containers({RUN_LABEL: run}) if c["Labels"]["ddctl-name"] == "L1")
        assert replacement["Id"] != mid.provider_id and replacement["State"] == "running"
        (tmp_path / "home" / "state.sqlite3").unlink()  # labels are the truth, not the cache
    finally:
        down = runner.invoke(app, ["down", "--run", run, "--json"])
        engine.close()
    assert down.exit_code == 0, down.output
    removed = json.loads(down.stdout)["removed"]
    assert instances_removed(json.loads(down.stdout)) == ["L0", "L1", "L2", "controller", "metadata", "syncer"]
    assert removed["metadata endpoint"] == ["metadata"] and len(removed["network"]) == 3  # every kind, exactly
    with Engine() as engine:
        assert engine.containers({RUN_LABEL: run}) == [] and engine.networks({RUN_LABEL: run}) == []
    again = runner.invoke(app, ["down", "--run", run, "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["removed"] == {}


def _row(status: dict[str, Any], region: str) -> dict[str, Any]:
    return dict(next(r["learners"][0] for r in status["regions"] if r["name"] == region))


def _partition_and_heal(run: str, engine: Engine, seconds: float = 25.0) -> None:
    before = _status()
    [vm] = [c["Id"] for c in engine.containers({RUN_LABEL: run}) if c["Labels"]["ddctl-name"] == "L2"]
    command = [sys.executable, "-c", "from ddctl.cli.app import main; main()", "chaos", "partition", "slow"]
    cut = subprocess.Popen([*command, "--for", str(seconds), "--json"], stdout=subprocess.PIPE, text=True)
    try:
        wait_until(
            lambda: _row(_status(), "slow")["seen_s_ago"] > 5, timeout_s=20, every_s=0.5, what="the slow region goes quiet"
        )
        during = _status()
        wait_until(
            lambda: _status()["rounds"] >= during["rounds"] + 2,
            timeout_s=20,
            every_s=0.5,
            what="the other regions keep merging while it is cut off",
        )
        out, _ = cut.communicate(timeout=seconds + 30)
    finally:
        if cut.poll() is None:
            cut.terminate()  # restores the link on its way out
            cut.wait(30)
    assert cut.returncode == 0 and json.loads(out)["seconds"] >= seconds, out

    def rejoined() -> dict[str, Any] | None:
        status = _status()
        row = _row(status, "slow")
        return (
            status
            if row["state"] == "training" and row["seen_s_ago"] < 3 and row["step"] > _row(before, "slow")["step"]
            else None
        )

    after = wait_until(rejoined, timeout_s=60, every_s=0.5, what="the cut-off learner reconnects on its own")
    assert [c["Id"] for c in engine.containers({RUN_LABEL: run}) if c["Labels"]["ddctl-name"] == "L2"] == [vm]
    assert after["ledger"]["balanced"] and after["ledger"]["received"] > before["ledger"]["received"]
    assert {"partition", "partition-healed"} <= {e["event"] for e in after["events"] if e["source"] == "ddctl"}
    syncer_saw = [
        (e["event"], e.get("reason", "")) for e in after["events"] if e["source"] == "syncer" and e.get("learner") == "L2"
    ]
    gone = next(i for i, (kind, reason) in enumerate(syncer_saw) if kind == "leave" and "no heartbeat" in reason)
    assert ("join", "") in syncer_saw[gone:], syncer_saw  # declared gone while cut off, back by itself


def _first_summary(log: Path) -> dict[str, Any] | None:
    """The exit summary the first incarnation printed (its container's log, collected when it was retired)."""
    if not log.exists():
        return None
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"reason"' in line:
            return dict(json.loads(line))
    return None

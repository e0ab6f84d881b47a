"""``ddctl up --dry-run`` with Docker regions: VMs deployed over SSH, shaped links, spot notices, ``down``.

Needs a Docker engine and root (tc in the containers' namespaces); `.ci/run`
installs Debian's docker.io and starts dockerd, so these run in CI.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control.up import admin_client
from ddctl.errors import UnreachableError
from ddctl.providers import deploy, linkshape
from ddctl.providers.base import RUN_LABEL
from ddctl.providers.docker.engine import Engine, engine_unavailable
from ddctl.providers.docker.vms import DockerProvider
from ddctl_agents.waiting import wait_until
from tests.builders import dry_run_up, instances_removed, status_json

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(engine_unavailable() is not None, reason=f"{engine_unavailable()}"),
    pytest.mark.skipif(linkshape.available() is not None, reason=f"{linkshape.available()}"),
]
runner = CliRunner()
RATES = {"fast": 30, "mid": 20, "slow": 10}
"""Mbit/s, up and down. Python's TLS and HTTP/2 on this 2-core machine, shared with three learners training and
the syncer, drive a few tens of Mbit/s: a 200 or 1000 Mbit/s link here would measure the CPU, not the shaper."""
TOLERANCE = 0.2
"""Each link must measure within this share of its shaped rate, both ways (issue 13)..."""
READINGS = 3
"""...in the median of this many readings, each from fresh samples. One reading of three may be off: a learner
starved of CPU by a loaded 2-core CI (three learners training, the syncer, the test) once read its 20 Mbit/s uplink
as 15.8 while the five other directions of that reading were within 6% of theirs."""
SAMPLED_BYTES = (4_500_000, 1_200_000)
"""Bytes each estimate must have read its rate from before it is judged: about eight 0.6 MB transfers (the rate is
the second best of the last eight; the first one or two of an uplink are timed by the syncer until the learner's
kernel reports), then two transfers more."""


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

        # every learner trains, and every link measures as it was shaped, both ways: the sender's kernel times
        # each transfer (bytes acknowledged over busy time), so neither a late reader nor tbf's burst inflates it
        readings = [_sampled(run, None)]
        while len(readings) < READINGS:  # again on fresh samples each time: not one lucky reading
            readings.append(_sampled(run, readings[-1]))
        for name, rate in RATES.items():
            for direction in ("up", "down"):
                measured = statistics.median(links[name][f"{direction}_mbps"] for links in readings)
                assert abs(measured - rate) <= TOLERANCE * rate, f"{name} {direction}: {measured} for {rate}; {readings}"

        # the machine is reachable over SSH with the run's key, and its link is shaped inside it
        shell = runner.invoke(app, ["ssh", "mid", "--", "tc", "qdisc", "show", "dev", "eth0"])
        assert shell.exit_code == 0, shell.output
        assert "tbf" in shell.stdout and f"{RATES['mid']}Mbit" in shell.stdout
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
        rounds = status_json()["rounds"]
        chaos = runner.invoke(app, ["chaos", "preempt", "mid", "--notice", "20", "--json"])
        assert chaos.exit_code == 0, chaos.output
        assert json.loads(chaos.stdout)["seconds_to_exit"] < 20  # it left on the notice, before the kill
        log = tmp_path / "home" / "runs" / run / "logs" / "L1.log"
        summary = wait_until(lambda: _first_summary(log), timeout_s=30, every_s=0.5, what="the preempted VM's log is collected")
        assert summary["reason"] == "preemption_notice" and summary["drained"]
        assert sum(summary["acked_tokens"].values()) == summary["sent_tokens"] > 0

        def rejoined() -> bool:
            status = status_json()
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


def _sampled(run: str, since: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Each region's learner's link figures once both estimates are the kernel's, read from ``SAMPLED_BYTES``
    (then that many more than in ``since``)."""
    seen: list[dict[str, dict[str, Any]]] = []

    def links() -> dict[str, dict[str, Any]] | None:
        client = admin_client(run)
        try:
            status = client.status()
        finally:
            client.close()
        rows = {e["region"]: e for e in status["learners"] if e["live"]}
        seen.append({name: {k: v for k, v in row.items() if "_mbps" in k or "_bytes" in k} for name, row in rows.items()})
        for name in RATES:
            for direction in ("up", "down"):
                needed = since[name][f"{direction}_sampled_bytes"] + SAMPLED_BYTES[1] if since else SAMPLED_BYTES[0]
                row = rows.get(name, {})
                if row.get(f"{direction}_timed_by") != "kernel" or row[f"{direction}_sampled_bytes"] < needed:
                    return None
        return rows

    try:
        return wait_until(links, timeout_s=240, every_s=1.0, what="every link to be sampled by the kernel")
    except TimeoutError:
        pytest.fail(f"not every link was sampled by the kernel: {seen[-2:]}")


def _row(status: dict[str, Any], region: str) -> dict[str, Any]:
    return dict(next(r["learners"][0] for r in status["regions"] if r["name"] == region))


def _partition_and_heal(run: str, engine: Engine, seconds: float = 35.0) -> None:
    before = status_json()
    [vm] = [c["Id"] for c in engine.containers({RUN_LABEL: run}) if c["Labels"]["ddctl-name"] == "L2"]
    command = [sys.executable, "-c", "from ddctl.cli.app import main; main()", "chaos", "partition", "slow"]
    cut = subprocess.Popen([*command, "--for", str(seconds), "--json"], stdout=subprocess.PIPE, text=True)
    try:
        wait_until(
            lambda: _row(status_json(), "slow")["seen_s_ago"] > 5, timeout_s=20, every_s=0.5, what="the slow region goes quiet"
        )
        during = status_json()
        wait_until(
            lambda: status_json()["rounds"] >= during["rounds"] + 2,
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
        status = status_json()
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

"""Learners on different accelerators, over the real service: what they say, what it refuses, and the MFU
the syncer works out from its own model for the status page, the metrics and the dashboard."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddctl.control.state import InstanceRecord
from ddctl.dashboard.snapshot import RunRecords, SyncerView, build
from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.train.flops import flops_per_token
from ddctl_agents.train.presets import get_preset
from tests.service_harness import Job, small_job

H100 = "NVIDIA H100 80GB HBM3"
H100_PEAK = 989e12
"""NVIDIA's data sheet: dense bf16 of one H100 SXM, written here rather than read from the table under test."""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    job = Job.create(tmp_path_factory.mktemp("accel"), small_job(learners=4))
    job.start_syncer("--snapshot-every", "3600", "--heartbeat-timeout", "3600")
    yield job
    job.stop_all()
    job.local.stop()


@pytest.fixture(scope="module")
def clients(job: Job) -> Iterator[dict[str, SyncerClient]]:
    out = {name: job.client(name) for name in ("L0", "L1", "L2", "L3")}
    for name, client in out.items():
        client.register(name, 1, f"region-{name}")
    yield out
    for client in out.values():
        client.close()


def heartbeat(learner: str, **fields: Any) -> dict[str, Any]:
    return {"learner": learner, "step": 8, "step_time": 0.1, "tokens": 8192, "tokens_per_s": 2e7, **fields}


def learner(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(entry for entry in status["learners"] if entry["id"] == name)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"accelerator": "x" * 65}, "accelerator"),
        ({"accelerator": "H100\r\nforged log line"}, "accelerator"),
        ({"accelerator": "H100\x07"}, "accelerator"),
        ({"devices": 0}, "devices"),
        ({"devices": 5000}, "devices"),
        ({"memory_gb": -1.0}, "memory_gb"),
        ({"memory_gb": float("nan")}, "memory_gb"),
        ({"uploads_in_flight": -1}, "uploads_in_flight"),
        ({"uploads_in_flight": 65}, "uploads_in_flight"),
        ({"uploads_in_flight": 2.5}, "uploads_in_flight"),
        ({"uploads_in_flight": "3"}, "uploads_in_flight"),
    ],
)
def test_a_bad_accelerator_field_is_refused_naming_it_and_the_service_goes_on(
    job: Job, clients: dict[str, SyncerClient], fields: dict[str, Any], named: str
) -> None:
    raw = json.dumps(heartbeat("L3", **fields)).encode()  # NaN written as NaN: the service, not the client, refuses
    answer = clients["L3"].http.post(f"{job.url}/v1/heartbeat", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and f"field '{named}'" in answer.json()["reason"]
    assert clients["L3"].heartbeat(heartbeat("L3", accelerator="cpu"))["stop"] is False
    assert learner(job.status(), "L3")["accelerator"] == "cpu"  # still answers, with the good heartbeat's word


def test_status_shows_each_learners_accelerator_and_the_syncers_own_mfu(job: Job, clients: dict[str, SyncerClient]) -> None:
    clients["L0"].heartbeat(heartbeat("L0", accelerator=H100, devices=8, memory_gb=79.6))
    clients["L1"].heartbeat(heartbeat("L1", accelerator="cpu", memory_gb=32.0))
    clients["L2"].heartbeat(heartbeat("L2"))  # an old learner: says nothing of its device
    status = job.status()
    l0, l1, l2 = (learner(status, name) for name in ("L0", "L1", "L2"))
    expected = 2e7 * flops_per_token(get_preset(small_job().inner.preset)) / (H100_PEAK * 8)
    assert 0.001 < expected < 1  # a figure rounding to 4 places can show
    assert (l0["accelerator"], l0["devices"], l0["memory_gb"]) == (H100, 8, 79.6)
    assert l0["mfu"] == pytest.approx(expected, abs=5e-5)
    assert (l1["accelerator"], l1["devices"], l1["mfu"]) == ("cpu", 1, None)
    assert (l2["accelerator"], l2["devices"], l2["memory_gb"], l2["mfu"]) == ("", 1, 0.0, None)
    clients["L2"].heartbeat(heartbeat("L2", accelerator="Some Future Chip 9000", devices=2))
    assert learner(job.status(), "L2")["mfu"] is None  # no peak known: no guess


def test_metrics_carry_throughput_devices_and_mfu_of_live_learners(job: Job, clients: dict[str, SyncerClient]) -> None:
    clients["L0"].heartbeat(heartbeat("L0", accelerator=H100, devices=8, memory_gb=79.6))
    status = job.status()
    samples = {
        (s.name, s.labels.get("learner")): s
        for family in text_string_to_metric_families(clients["L0"].metrics())
        for s in family.samples
        if s.name.startswith("ddctl_learner_")
    }
    assert samples[("ddctl_learner_mfu", "L0")].value == pytest.approx(learner(status, "L0")["mfu"])
    assert samples[("ddctl_learner_mfu", "L0")].labels == {"learner": "L0", "region": "region-L0"}
    assert ("ddctl_learner_mfu", "L1") not in samples  # a CPU's MFU is unknown, not 0
    devices = samples[("ddctl_learner_devices", "L0")]
    assert devices.value == 8 and devices.labels["accelerator"] == H100
    assert samples[("ddctl_learner_tokens_per_second", "L1")].value == 2e7


def test_a_learner_that_registers_again_keeps_its_device_until_its_next_heartbeat_says(
    job: Job, clients: dict[str, SyncerClient]
) -> None:
    clients["L0"].heartbeat(heartbeat("L0", accelerator=H100, devices=8))
    clients["L0"].register("L0", 2, "region-L0")  # a new life, on the same machine
    assert (learner(job.status(), "L0")["accelerator"], learner(job.status(), "L0")["devices"]) == (H100, 8)
    clients["L0"].heartbeat(heartbeat("L0", accelerator="NVIDIA A100-SXM4-80GB", devices=4))
    again = learner(job.status(), "L0")
    assert (again["accelerator"], again["devices"]) == ("NVIDIA A100-SXM4-80GB", 4)
    assert again["mfu"] == pytest.approx(2e7 * flops_per_token(get_preset("tiny")) / (312e12 * 4), abs=5e-5)


def test_status_json_of_ddctl_carries_the_syncers_accelerator_fields(job: Job, clients: dict[str, SyncerClient]) -> None:
    clients["L0"].heartbeat(heartbeat("L0", accelerator=H100, devices=8, memory_gb=79.6))
    status = job.status()
    record = InstanceRecord("r", "L0", "region-L0", "process", "learner", "running", "p0", 0.0, {})
    snapshot = build(RunRecords(run="r", provider="process", instances=[record]), SyncerView(status, 0.0), 0.0)
    (row,) = snapshot["regions"][0]["learners"]
    assert (row["accelerator"], row["devices"], row["memory_gb"]) == (H100, 8, 79.6)
    assert row["mfu"] is not None and row["mfu"] == learner(status, "L0")["mfu"]


def test_each_learners_uploads_in_flight_reach_status_and_metrics(job: Job, clients: dict[str, SyncerClient]) -> None:
    clients["L0"].heartbeat(heartbeat("L0", uploads_in_flight=2))
    clients["L1"].heartbeat(heartbeat("L1"))  # a learner too old to say
    status = job.status()
    assert (learner(status, "L0")["uploads_in_flight"], learner(status, "L1")["uploads_in_flight"]) == (2, None)
    samples = {
        s.labels["learner"]: s.value
        for family in text_string_to_metric_families(clients["L0"].metrics())
        for s in family.samples
        if s.name == "ddctl_learner_uploads_in_flight"
    }
    assert samples.get("L0") == 2 and "L1" not in samples  # unknown is absent, not 0
    clients["L0"].heartbeat(heartbeat("L0", uploads_in_flight=3))
    status = job.status()
    assert learner(status, "L0")["uploads_in_flight"] == 3  # the pacer's cap moves: the page follows
    record = InstanceRecord("r", "L0", "region-L0", "process", "learner", "running", "p0", 0.0, {})
    snapshot = build(RunRecords(run="r", provider="process", instances=[record]), SyncerView(status, 0.0), 0.0)
    assert snapshot["regions"][0]["learners"][0]["uploads_in_flight"] == 3  # what ddctl status --json and the dashboard read

"""What a second hostile-input audit of the real service found answering 500 (each retried by the learner's client,
each retry one more rejection counted against it): each is now a 4xx, durable where it counts, and the rounds go on."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import torch

from ddctl_agents.agent.client import SyncerClient
from ddctl_agents.core.messages import Update, encode_update
from ddctl_agents.train.assembly import Assembly
from tests.service_harness import Job, small_job
from tests.test_service_trust import frame, refused, still_merges, version

Served = tuple[Job, dict[str, SyncerClient], Assembly]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A syncer of this module's own (rejections count against its learners), three registered learners, the model."""
    job = Job.create(tmp_path_factory.mktemp("audit"), small_job(learners=3))
    job.start_syncer("--snapshot-every", "3600")
    clients = {name: job.client(name) for name in ("L0", "L1", "L2")}
    try:
        for name, client in clients.items():
            client.register(name, 1, f"region-{name}")
        yield job, clients, Assembly.build(small_job(learners=3))
    finally:
        for client in clients.values():
            client.close()
        job.stop_all()


def test_a_rejection_whose_reason_quotes_long_tensor_names_is_a_400_and_durable(served: Served) -> None:
    """Six 250-character tensor names made a 1,600-character reason that its log record refused: a 500 after the
    rejection had counted, never logged, so a restart forgot it."""
    job, clients, assembly = served
    tensors = {f"{i}{'n' * 249}": torch.zeros(3) for i in range(6)}
    update = Update(learner="L1", fragment=0, base_version=version(job, 0), update_id="L1.1.long", step=8, c_steps=8,
                    c_tokens=8192, tensors=tensors)  # fmt: skip
    tape = job.job_dir / "state" / "tape.jsonl"
    err = refused(lambda: clients["L1"].push(encode_update(update, "fp32", 64), 0))
    assert (err.status, err.code) == (400, "bad_update") and "fragment 0 holds" in err.reason
    assert 400 < len(err.reason) <= 500 and err.reason.endswith(")"), err.reason  # cut, and it says by how much
    rejected = [r for r in map(json.loads, tape.read_text().splitlines()) if r.get("status") == "rejected"]
    assert [(r["learner"], r["update_id"]) for r in rejected] == [("L1", "L1.1.long")]  # logged, so taped
    status = job.status()
    assert next(r for r in status["learners"] if r["id"] == "L1")["rejections"] == 1
    still_merges(job, clients["L0"], assembly, "L0")


def test_an_update_of_no_fragment_of_the_job_or_another_than_its_header_is_a_400(served: Served) -> None:
    """Fragment 99 without the upload's header was rejected, then indexed the published versions: a 500. A header
    naming another fragment than the body's credited the upload's progress to the wrong one."""
    job, clients, assembly = served
    body = frame(assembly, "L2", 0, version(job, 0))
    update = Update(learner="L2", fragment=99, base_version=0, update_id="L2.1.far", step=8, c_steps=8, c_tokens=8192,
                    tensors={"w": torch.zeros(3)})  # fmt: skip
    plain = {"content-type": "application/x-ddctl-frame"}
    answer = clients["L2"].http.post(f"{job.url}/v1/updates", content=encode_update(update, "fp32", 64), headers=plain)
    assert answer.status_code == 400 and "fragment 99 out of range" in answer.json()["reason"], answer.text
    err = refused(lambda: clients["L2"].push(body, 1))
    assert err.status == 400 and "header x-ddctl-fragment says 1, the update is of fragment 0" in err.reason
    assert clients["L2"].push(body, 0)["status"] == "accepted"  # the same update, told rightly: nothing was taken
    still_merges(job, clients["L0"], assembly, "L0", fragment=1)


def test_a_reason_cannot_pass_for_more_fields_of_its_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """A leave reason ``left learner=L9 region=x`` read as two more fields of the roster's ``key=value`` line."""
    from ddctl_agents.service.roster import Roster

    with caplog.at_level(logging.INFO, logger="ddctl_agents.service.roster"):
        Roster().event(1.0, "leave", learner="L0", reason='left learner=L9 region="x"', tokens=5, note="")
    assert caplog.messages == ['leave learner=L0 reason="left learner=L9 region=\\"x\\"" tokens=5 note=""']

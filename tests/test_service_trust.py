"""The trust boundary over the real service: what an authenticated but hostile learner cannot do.

One TLS syncer process serves the module, as ``ddctl syncer serve`` on
loopback. The first five tests are the five findings of issue 11, each of
which stopped merging or answered 500 before; after each, a legitimate update
must still merge. The module ends with a kill -9 and a restart that comes up
with its books balanced.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl_agents.agent.client import Refused, SyncerClient
from ddctl_agents.core.messages import Update, encode_update
from ddctl_agents.core.wire import pack, unpack
from ddctl_agents.train.assembly import Assembly
from tests.h2raw import RawH2, request_headers
from tests.service_harness import Job, small_job

_ids = itertools.count()
Clients = dict[str, SyncerClient]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    job = Job.create(tmp_path_factory.mktemp("trust"), small_job(learners=4))
    job.start_syncer("--snapshot-every", "3600")
    yield job
    job.stop_all()


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(small_job(learners=4))


@pytest.fixture(scope="module")
def clients(job: Job) -> Iterator[dict[str, SyncerClient]]:
    out = {name: job.client(name) for name in ("L0", "L1", "L2", "L3")}
    for name, client in out.items():
        client.register(name, 1, f"region-{name}")
    yield out
    for client in out.values():
        client.close()


def frame(assembly: Assembly, learner: str, fragment: int, base: int, value: float = 1e-3, transpose: bool = False) -> bytes:
    tensors = {
        s.name: torch.full(tuple(reversed(s.shape)) if transpose else s.shape, value)
        for s in assembly.fragmentation.fragments[fragment]
    }
    update = Update(
        learner=learner, fragment=fragment, base_version=base, update_id=f"{learner}.1.{next(_ids)}",
        step=8, c_steps=8, c_tokens=8192, tensors=tensors,
    )  # fmt: skip
    return encode_update(update, "int4", 64)


def version(job: Job, fragment: int) -> int:
    return int(job.status()["versions"][fragment])


def still_merges(job: Job, client: SyncerClient, assembly: Assembly, learner: str, fragment: int = 0) -> None:
    """The round loop is alive: a legitimate update is merged into a new version."""
    before = version(job, fragment)
    client.push(frame(assembly, learner, fragment, before), fragment)
    job.wait_for(lambda s: s["versions"][fragment] > before, 15, f"fragment {fragment} to merge after the attack")


def refused(call: Any) -> Refused:
    with pytest.raises(Refused) as info:
        call()
    return info.value


def raw(job: Job) -> RawH2:
    return RawH2("127.0.0.1", job.local.port, job.local.ca)


def heartbeat(learner: str, **fields: Any) -> dict[str, Any]:
    return {"learner": learner, "step": 8, "step_time": 0.1, "tokens": 8192, "tokens_per_s": 1e4, **fields}


def test_finding1_finite_but_huge_values_are_refused_before_the_log(
    job: Job, clients: dict[str, SyncerClient], assembly: Assembly
) -> None:
    received = job.status()["ledger"]["received"]
    err = refused(lambda: clients["L1"].push(frame(assembly, "L1", 1, version(job, 1), value=2e38), 1))
    assert (err.status, err.code) == (422, "out_of_bounds") and "moves a parameter by" in err.reason
    assert job.status()["ledger"]["received"] == received  # never acknowledged, never logged
    still_merges(job, clients["L0"], assembly, "L0", fragment=1)


def test_finding2_a_late_update_with_transposed_shapes_is_refused(
    job: Job, clients: dict[str, SyncerClient], assembly: Assembly
) -> None:
    p = next(
        i
        for i, frag in enumerate(assembly.fragmentation.fragments)
        if any(len(s.shape) == 2 and s.shape[0] != s.shape[1] for s in frag)
    )
    still_merges(job, clients["L0"], assembly, "L0", fragment=p)  # so that base v-1 exists
    late = frame(assembly, "L2", p, version(job, p) - 1, transpose=True)
    err = refused(lambda: clients["L2"].push(late, p))
    assert (err.status, err.code) == (400, "bad_update") and "float32" in err.reason
    still_merges(job, clients["L0"], assembly, "L0", fragment=p)


def test_finding3_a_heartbeat_with_an_enormous_due_step_is_refused(
    job: Job, clients: dict[str, SyncerClient], assembly: Assembly
) -> None:
    count = assembly.fragmentation.count
    answer = clients["L0"].http.post(
        f"{job.url}/v1/heartbeat",
        content=json.dumps(heartbeat("L0", due=[10**400] * count)).encode(),
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400 and "'due.0'" in answer.json()["reason"]
    err = refused(lambda: clients["L0"].heartbeat(heartbeat("L0", due=[1] * (count + 1))))
    assert err.status == 400 and "one step per fragment" in err.reason
    still_merges(job, clients["L0"], assembly, "L0")


def test_finding4_a_heartbeat_cannot_break_the_status_page(job: Job, clients: Clients) -> None:
    err = refused(lambda: clients["L0"].heartbeat(heartbeat("L0", rtt_s=1e308)))
    assert err.status == 400 and "'rtt_s'" in err.reason
    for bad in ({"up_bytes": 1 << 62, "up_seconds": 1e-300}, {"loss": 1e300}, {"tokens_per_s": 1e300}):
        refused(lambda bad=bad: clients["L0"].heartbeat(heartbeat("L0", **bad)))  # type: ignore[misc]
    clients["L0"].heartbeat(heartbeat("L0", rtt_s=599.0, up_bytes=1 << 40, up_seconds=1e-6))
    assert job.status()["learners"][0]["id"] == "L0"  # still answers, as JSON
    assert "ddctl_rounds_total" in clients["L0"].metrics()


def test_finding5_malformed_integers_and_bytes_are_4xx_never_500(job: Job, clients: dict[str, SyncerClient]) -> None:
    client = raw(job)
    token = job.token("L0")
    try:
        cases = {
            "fragment header ²": (request_headers("POST", b"/v1/updates", token, [(b"x-ddctl-fragment", "²".encode())]), b"x"),
            "path segment ²": (request_headers("GET", b"/v1/fragments/%C2%B2", token), b""),
            "raw non-ASCII path": (request_headers("GET", "/v1/fragments/²".encode(), token), b""),
            "5000 digits": (request_headers("POST", b"/v1/heartbeat", token), b'{"learner":"L0","step":' + b"9" * 5000 + b"}"),
            "10^400": (request_headers("POST", b"/v1/heartbeat", token), b'{"learner":"L0","step":1' + b"0" * 400 + b"}"),
            "0xFF in a query": (request_headers("GET", b"/v1/fragments/0?since=\xff", token), b""),
            "0xFF in the stream's": (request_headers("GET", b"/v1/fragments?since=\xff\xfe", token), b""),
            "since ²": (request_headers("GET", "/v1/fragments/0?since=²".encode(), token), b""),
        }
        answers = {name: client.request(headers, body) for name, (headers, body) in cases.items()}
    finally:
        client.close()
    assert all(400 <= status < 500 for status, _ in answers.values()), answers
    assert answers["path segment ²"][0] == 404 and answers["0xFF in a query"][0] == 400
    assert answers["raw non-ASCII path"][0] == 400 and client.reconnects == 1  # answered on its stream; the connection lives
    assert b"ASCII digits" in answers["fragment header ²"][1]


def test_a_hostile_absorbed_field_is_a_400_naming_it_and_nothing_is_taped(
    job: Job, clients: dict[str, SyncerClient], assembly: Assembly
) -> None:
    """What an update says it absorbed (what a replay makes again) is checked before it is logged or taped."""
    update = unpack(frame(assembly, "L2", 1, version(job, 1)), keep_packed=False)
    tape = job.job_dir / "state" / "tape.jsonl"
    taped = tape.read_bytes()
    hostile = [
        ([["L2.1.0", 4, 0]] * 70_000, "exceeds the 1048576-byte limit"),  # huge: the frame's header bound comes first
        ([["L2.1.0", 2**70, 0]], "absorbed"),  # overflowing
        ([["L2.1.0", 4]], "absorbed"),  # truncated
        ([[["L2.1.0"], 4, 0]], "absorbed"),  # wrong shape
        ([["L2.1.0", -1, 0]], "absorbed"),
        ([["L2.1.0", 9, 0]], "absorbed"),  # made after the update (step 8)
        ([["L2.1.0", 4, 1]], "absorbed"),  # more adoptions than it carries (none)
        ("L2.1.0", "absorbed"),
    ]
    for bad, needle in hostile:
        body = pack("update", update.meta | {"absorbed": bad}, dict(update.tensors), "int4", 64)
        answer = refused(lambda body=body: clients["L2"].push(body, 1))
        assert answer.status == 400 and needle in str(answer), answer
    assert tape.read_bytes() == taped  # nothing acknowledged, nothing recorded
    still_merges(job, clients["L2"], assembly, "L2", fragment=1)


def test_a_learner_that_keeps_sending_bad_updates_is_suspended_then_readmitted(
    job: Job, clients: dict[str, SyncerClient], assembly: Assembly
) -> None:
    l3 = clients["L3"]
    for value in (2e38, 1e30):
        refused(lambda value=value: l3.push(frame(assembly, "L3", 2, version(job, 2), value=value), 2))  # type: ignore[misc]
    third = refused(lambda: l3.push(frame(assembly, "L3", 2, version(job, 2), transpose=True), 2))
    assert third.code == "bad_update", third
    err = refused(lambda: l3.push(frame(assembly, "L3", 2, version(job, 2)), 2))
    assert (err.status, err.code) == (403, "suspended") and "ddctl syncer readmit L3" in err.reason
    assert refused(lambda: l3.heartbeat(heartbeat("L3"))).code == "suspended"
    status = job.status()
    me = next(learner for learner in status["learners"] if learner["id"] == "L3")
    assert me["state"] == "suspended" and me["rejections"] == 3 and status["suspended"] == ["L3"]
    assert any(e["event"] == "suspended" and e["learner"] == "L3" for e in status["events"])
    assert 'ddctl_learner_suspended{learner="L3"} 1' in l3.metrics()
    assert "L3" not in status["live"]
    still_merges(job, clients["L0"], assembly, "L0", fragment=2)  # the others never notice
    cli = ["syncer", "readmit", "L3", "--url", job.url, "--job-dir", str(job.job_dir), "--json"]
    answer = CliRunner().invoke(app, cli)
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.stdout)["readmitted"] is True
    again = CliRunner().invoke(app, cli)
    assert json.loads(again.stdout)["readmitted"] is False and "not suspended" in json.loads(again.stdout)["reason"]
    l3.register("L3", 2, "region-L3")
    assert l3.push(frame(assembly, "L3", 2, version(job, 2)), 2)["status"] == "accepted"


def test_a_suspended_learner_agent_waits_to_be_readmitted_instead_of_crash_looping(
    job: Job, clients: Clients, assembly: Assembly
) -> None:
    l2 = clients["L2"]  # one rejection so far (finding 2): two more suspend it
    for _ in range(2):
        refused(lambda: l2.push(frame(assembly, "L2", 0, version(job, 0), value=2e38), 0))
    assert job.status()["suspended"] == ["L2"]
    agent = job.start_learner("L2", "--syncer-timeout", "6")
    try:
        deadline = time.monotonic() + 90
        while "suspended by the synchronizer" not in job.log("L2"):
            assert agent.poll() is None and time.monotonic() < deadline, job.log("L2")[-2000:]
            time.sleep(0.5)
        time.sleep(8)  # longer than its dead-man switch: a suspension is not a lost syncer
        assert agent.poll() is None, job.log("L2")[-2000:]
        err = refused(lambda: clients["L0"].readmit("L2"))  # a learner cannot readmit anyone
        assert err.status == 403 and "admin" in err.reason
    finally:
        admin = job.client()
        try:
            assert admin.readmit("L2")["readmitted"] is True
        finally:
            admin.close()
    job.wait_for(lambda s: "L2" in s["live"], 60, "the readmitted agent to register on its own")
    agent.terminate()
    assert agent.wait(timeout=60) == 0, job.log("L2")[-2000:] + job.log("syncer")[-6000:]


def test_health_reports_suspensions_and_a_restart_after_kill9_balances(
    job: Job, clients: dict[str, SyncerClient], assembly: Assembly
) -> None:
    health = clients["L0"].health()
    assert health["ok"] is True and health["state"] in ("healthy", "degraded") and health["degraded"] == []
    before = job.status()
    assert job.syncer is not None
    job.kill(job.syncer)
    job.start_syncer("--snapshot-every", "3600")
    after = job.status()
    assert after["ledger"] == before["ledger"] and after["ledger"]["balanced"]
    assert after["versions"] == before["versions"] and after["recovered"]["quarantined"] == 0
    l0 = job.client("L0")
    try:
        still_merges(job, l0, assembly, "L0")
    finally:
        l0.close()


def _with_scale(body: bytes, scale: float) -> bytes:
    """An int4 frame whose first block scale is ``scale`` (codes untouched), its checksum made valid again."""
    first = next(iter(unpack(body, keep_packed=True).tensors.packed.values()))  # type: ignore[attr-defined]
    at = first.scales - np.frombuffer(body, dtype=np.uint8).ctypes.data
    patched = bytearray(body)
    patched[at : at + 4] = struct.pack("<f", scale)
    patched[-4:] = struct.pack("<I", zlib.crc32(patched[:-4]))
    return bytes(patched)


@pytest.mark.parametrize(
    ("scale", "code"), [(math.nan, "non_finite"), (math.inf, "non_finite"), (3e38, "non_finite"), (1e30, "out_of_bounds")]
)
def test_hostile_scales_in_a_packed_update_are_refused_and_the_rounds_go_on(
    job: Job, assembly: Assembly, scale: float, code: str
) -> None:
    """The admission check reads int4 frames without decoding them: a scale that decodes to NaN, Inf (7 x 3e38
    overflows) or a huge value is still a 422 with its code, never a 500, and the round loop keeps merging."""
    learner = job.client("L0")
    try:
        learner.register("L0", 1, "region-L0")
        received = job.status()["ledger"]["received"]
        err = refused(lambda: learner.push(_with_scale(frame(assembly, "L0", 3, version(job, 3)), scale), 3))
        assert (err.status, err.code) == (422, code), err
        assert job.status()["ledger"]["received"] == received
        readmitted = job.client()
        try:
            readmitted.readmit("L0")  # the four cases would suspend L0 otherwise; the others rely on it
        finally:
            readmitted.close()
        learner.register("L0", 1, "region-L0")
        still_merges(job, learner, assembly, "L0", fragment=3)
    finally:
        learner.close()

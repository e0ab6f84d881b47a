"""Versions sent as int8 deltas (``down_codec: int8-delta``): learners hold the synchronizer's bits, the rounding
does not pile up, a delta goes only where it steps from what is held, and a hostile delta is refused."""

from __future__ import annotations

import itertools
import struct
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from builders import small_run
from ddctl.config.train import ClusterConfig, Outage
from ddctl.control.quotes import sync_traffic
from ddctl.local.replay import replay_tapes
from ddctl.local.training import train_decoupled
from ddctl_agents.core.choices import DELTA, DOWN_CODECS, wire_codec
from ddctl_agents.core.crc import crc32
from ddctl_agents.core.ending import FINISHED
from ddctl_agents.core.messages import FragmentVersion, decode_fragment, encode_fragment, encode_update
from ddctl_agents.core.version_delta import Chains, Held, Whole, coder, receive
from ddctl_agents.core.wire import pack, unpack
from ddctl_agents.errors import ConfigError, WireError
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.job import JobConfig
from tests.service_harness import Job, small_job
from tests.test_service_http import make_update

BLOCK = 128


def drifting(versions: int, seed: int = 0) -> list[FragmentVersion]:
    """A fragment's versions as outer steps make them: weights near 0.02, each step about 1e-3 per value."""
    g = torch.Generator().manual_seed(seed)
    values = {"w": torch.randn(96, 40, generator=g) * 0.02, "b": torch.randn(200, generator=g) * 0.02}
    out = []
    for v in range(versions):
        out.append(FragmentVersion(fragment=2, version=v, tensors=values, vclock={"syncer": v}))
        values = {name: t + torch.randn(t.shape, generator=g) * 1e-3 for name, t in values.items()}
    return out


def follow(chains: Chains, versions: list[FragmentVersion]) -> tuple[list[FragmentVersion], list[int], list[int]]:
    """A learner that receives every version: what it holds after each, and each frame's size and bf16's."""
    held: dict[int, Held] = {}
    got, sizes, keys = [], [], []
    for message in versions:
        coded = chains.code(message)
        frame, made = coded.sent(held[2].version if 2 in held else -1, rounded=False)
        received, held[2] = receive(frame, held)
        got.append(received)
        sizes.append(len(frame))
        keys.append(len(coded.key))
        assert all(torch.equal(received.tensors[n], made.tensors[n]) for n in received.tensors)  # the same bits
        assert made is coded.message
    return got, sizes, keys


def test_a_learner_following_the_chain_holds_the_synchronizers_bits_in_about_half_of_bf16s_bytes() -> None:
    versions = drifting(40)
    got, sizes, keys = follow(Chains(BLOCK), versions)
    assert sizes[0] > 1.9 * keys[0]  # the first is whole, exactly: fp32
    assert all(size < 0.6 * key for size, key in zip(sizes[1:], keys[1:], strict=True))
    assert [m.version for m in got] == list(range(40)) and got[-1].vclock == {"syncer": 39}


def test_the_rounding_does_not_pile_up_and_stays_below_bf16s() -> None:
    """Each delta is taken from the reconstruction, so its rounding is carried into the next one: after 200
    versions the error is one int8 rounding of one step, below what bf16 makes of the values themselves."""
    versions = drifting(200, seed=1)
    got, _, _ = follow(Chains(BLOCK), versions)

    def error(held: FragmentVersion, true: FragmentVersion) -> float:
        return max((held.tensors[n] - true.tensors[n]).abs().max().item() for n in true.tensors)

    bf16 = max(error(Whole("bf16", BLOCK).code(m).message, m) for m in versions[-20:])
    late = max(error(h, m) for h, m in zip(got[-20:], versions[-20:], strict=True))
    early = max(error(h, m) for h, m in zip(got[1:21], versions[1:21], strict=True))
    assert late < 0.2 * bf16 and late <= 1.5 * early, (late, early, bf16)
    # stepping from the true previous values instead (no error feedback) drifts away: the design's reason
    held = dict(versions[0].tensors)
    for m in versions[1:]:
        change = {n: m.tensors[n] - versions[m.version - 1].tensors[n] for n in held}
        q = unpack(pack("fragment", {}, change, "int8", BLOCK)).tensors
        held = {n: held[n] + q[n] for n in held}
    drift = max((held[n] - versions[-1].tensors[n]).abs().max().item() for n in held)
    assert drift > 5 * late, (drift, late)


def test_a_delta_goes_only_to_a_learner_holding_the_version_it_steps_from() -> None:
    chains, versions = Chains(BLOCK), drifting(4)
    first, second, third = (chains.code(m) for m in versions[:3])
    assert second.base == 0 and third.base == 1
    assert third.sent(1, rounded=False) == (third.delta, third.message)
    assert third.exact is not None and first.exact is not None
    assert third.sent(0, rounded=False) == (third.exact.frame(), third.message) == third.sent(-1, rounded=False)
    # a learner whose stream missed version 1 gets version 2 whole, exactly, and holds the chain's bits
    held = {2: receive(first.exact.frame(), {})[1]}
    message, held[2] = receive(third.sent(0, rounded=False)[0], held)
    assert all(torch.equal(message.tensors[n], third.message.tensors[n]) for n in message.tensors)
    # a learner at cadence k > 1 (sent only what it adopts) gets each whole in bf16, as with the bf16 codec
    frame, made = third.sent(1, rounded=True)
    assert frame == third.key and made is third.rounded
    assert all(torch.equal(receive(frame, held)[0].tensors[n], third.rounded.tensors[n]) for n in made.tensors)
    assert all(torch.equal(third.rounded.tensors[n], third.message.tensors[n].bfloat16().float()) for n in made.tensors)
    assert chains.code(versions[2]) is third  # sent again (a bootstrap, a resync): the same frames
    stale = chains.code(versions[1])  # an older version than the chain's head: whole, and the chain stays
    assert stale.delta is None and chains.code(versions[3]).base == 2


def test_the_chain_does_not_follow_the_values_it_was_given() -> None:
    """The synchronizer's live parameters change in place after a version is coded: the chain keeps its own."""
    live = {"w": torch.zeros(64)}
    chains = Chains(BLOCK)
    first = chains.code(FragmentVersion(fragment=0, version=0, tensors=live))
    live["w"].add_(1.0)
    assert torch.equal(first.message.tensors["w"], torch.zeros(64))
    assert torch.equal(chains.code(FragmentVersion(fragment=0, version=1, tensors=live)).message.tensors["w"], live["w"])


def test_a_fragment_whose_tensors_change_starts_a_new_chain() -> None:
    chains = Chains(BLOCK)
    chains.code(FragmentVersion(fragment=0, version=0, tensors={"w": torch.zeros(8)}))
    coded = chains.code(FragmentVersion(fragment=0, version=1, tensors={"w": torch.zeros(9)}))
    assert coded.delta is None and coded.base == -1


def test_whole_versions_are_the_codecs_frames() -> None:
    message = drifting(1)[0]
    for codec in ("bf16", "fp32"):
        coded = coder(codec, BLOCK).code(message)
        assert isinstance(coder(codec, BLOCK), Whole) and coded.key == encode_fragment(message, codec, BLOCK)
        for holds, rounded in ((0, False), (-1, False), (0, True)):
            assert coded.sent(holds, rounded) == (coded.key, coded.message)
    assert isinstance(coder(DELTA, BLOCK), Chains)
    assert DELTA in DOWN_CODECS and wire_codec(DELTA) == "int8" and wire_codec("bf16") == "bf16"


def test_the_job_takes_the_delta_codec_and_refuses_others_naming_the_allowed() -> None:
    assert JobConfig(down_codec=DELTA).down_codec == DELTA
    with pytest.raises(ConfigError, match="down codec must be one of bf16, fp32, int8-delta, got 'int4'"):
        JobConfig(down_codec="int4")


def hostile(base: object, shape: tuple[int, ...] = (96, 40), to: int = 1) -> bytes:
    meta = {**FragmentVersion(fragment=2, version=to, tensors={}).meta(), "base": base}
    return pack("fragment", meta, {"w": torch.zeros(shape), "b": torch.zeros(200)}, "int8", BLOCK)


@pytest.mark.parametrize(
    ("frame", "needle"),
    [
        (hostile(1), "from version 1 to 1; this learner holds version 0"),
        (hostile(5, to=6), "from version 5 to 6; this learner holds version 0"),
        (hostile("0"), "from version '0'"),
        (hostile(True), "from version True"),
        (hostile(-1), "from version -1"),
        (hostile(0, shape=(40, 96)), "other tensors or shapes"),
    ],
)
def test_a_delta_that_does_not_step_from_what_is_held_is_refused(frame: bytes, needle: str) -> None:
    exact = Chains(BLOCK).code(drifting(1)[0]).exact
    assert exact is not None
    held = {2: receive(exact.frame(), {})[1]}
    with pytest.raises(WireError, match=needle):
        receive(frame, held)
    with pytest.raises(WireError, match="this learner holds nothing"):
        receive(hostile(0), {})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_version_that_is_not_finite_is_refused_whole_or_as_a_delta(bad: float) -> None:
    """A NaN block scale in a delta, or a NaN value in a whole version, would poison every value a learner adopts."""
    held = {2: Held(0, {"w": torch.zeros(96, 40), "b": torch.zeros(200)})}

    def first_float(frame: bytes) -> bytes:  # the payload's first four bytes set to ``bad``, the checksum made good
        out = bytearray(frame)
        header = struct.unpack_from("<I", out, 8)[0]
        out[20 + header : 24 + header] = struct.pack("<f", bad)
        out[-4:] = struct.pack("<I", crc32(bytes(out[:-4])))
        return bytes(out)

    with pytest.raises(WireError, match="version 1 of fragment 2: b has a value that is not finite"):
        receive(first_float(hostile(0)), held)  # the first block's scale
    whole = encode_fragment(FragmentVersion(fragment=2, version=1, tensors={"w": torch.zeros(2)}), "fp32", BLOCK)
    with pytest.raises(WireError, match="w has a value that is not finite"):
        receive(first_float(whole), held)


def test_a_reader_of_whole_versions_refuses_a_delta() -> None:
    chains, versions = Chains(BLOCK), drifting(2)
    chains.code(versions[0])
    delta = chains.code(versions[1]).delta
    assert delta is not None
    with pytest.raises(WireError, match="a delta from version 0, not a whole version"):
        decode_fragment(delta)
    assert decode_fragment(chains.code(versions[1]).key)[0].version == 1


def test_the_whole_version_is_the_reconstruction_not_the_true_values() -> None:
    """A learner joining mid-chain must hold what the others hold, or the next delta lands elsewhere."""
    chains, versions = Chains(BLOCK), drifting(6)
    for m in versions:
        coded = chains.code(m)
    assert coded.exact is not None
    joined = decode_fragment(coded.exact.frame())[0]
    assert all(torch.equal(joined.tensors[n], coded.message.tensors[n]) for n in joined.tensors)
    assert any(not torch.equal(coded.message.tensors[n], versions[-1].tensors[n]) for n in joined.tensors)


def test_the_exact_frame_is_made_only_for_who_needs_it_and_then_once() -> None:
    """Most versions are followed by deltas only: the synchronizer keeps the fp32 values, a bf16 frame and a delta
    (7 bytes per value), and makes the fp32 frame (4 more) for a joiner, once per version."""
    chains, versions = Chains(BLOCK), drifting(5)
    made = [chains.code(m) for m in versions]
    assert all(c.exact is not None and not c.exact.ready for c in made)
    values = sum(t.numel() for t in versions[0].tensors.values())
    head = made[-1]
    held = sum(t.numel() * t.element_size() for t in head.message.tensors.values()) + len(head.key) + len(head.delta or b"")
    assert 6.9 * values < held < 7.4 * values, held / values  # fp32 + bf16 + int8 with block scales
    frame, _ = head.sent(1, rounded=False)  # a learner that missed version 3
    assert head.exact is not None and head.exact.ready and len(frame) > 4 * values
    assert head.sent(-1, rounded=False)[0] is frame  # the next joiner is sent the same bytes, not a new encoding
    assert not made[-2].exact.ready  # type: ignore[union-attr]  # an older version nobody joined at: never made


def test_the_service_makes_an_exact_frame_off_its_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large fragment's fp32 frame takes a while to encode: the subscriber that needs it first must not stall
    every other request the event loop serves."""
    import asyncio
    import threading

    from ddctl_agents.core import version_delta
    from ddctl_agents.service.publisher import Publisher

    publisher, versions = Publisher(1, Chains(BLOCK, adopted=False)), drifting(3)
    items = [publisher.code(m) for m in versions]
    encoded_on: list[str] = []
    real = encode_fragment

    def spied(message: FragmentVersion, codec: str, block: int) -> bytes:
        encoded_on.append(threading.current_thread().name)
        return real(message, codec, block)

    monkeypatch.setattr(version_delta, "encode_fragment", spied)

    async def main() -> tuple[str, bytes | None, bytes, bytes]:
        delta = await items[-1].frame_for(1, rounded=False)  # a follower: its delta, nothing encoded
        assert not encoded_on
        whole = await items[-1].frame_for(0, rounded=False)  # a learner that missed version 1
        again = await items[-1].whole()  # GET /v1/fragments/0 after it
        return threading.current_thread().name, delta, whole, again

    loop_thread, delta, whole, again = asyncio.run(main())
    assert delta == items[-1].delta and whole is again
    assert len(encoded_on) == 1 and encoded_on[0] != loop_thread  # once, on a worker thread
    message = decode_fragment(whole)[0]
    assert message.version == 2 and all(torch.equal(message.tensors[n], items[-1].exact.message.tensors[n])  # type: ignore[union-attr]
                                        for n in message.tensors)  # fmt: skip


# -- over HTTP/2, real processes ---------------------------------------------------------------------


def test_a_subscriber_of_the_chain_is_sent_deltas_and_one_of_another_chain_whole_versions(tmp_path: Path) -> None:
    config = replace(small_job(learners=2), down_codec=DELTA)
    job, assembly = Job.create(tmp_path, config), Assembly.build(config)
    job.start_syncer()
    subscriber, pusher = job.client("L0"), job.client("L0")
    try:
        pusher.register("L0", 1, "region-L0")
        chain, held, whole_bytes = [""], {}, {}
        stream = subscriber.fragments([-1] * 4, chain)
        while len(held) < 4:  # the bootstrap: every fragment whole
            if frame := next(stream):
                message, held[message.fragment] = receive(frame, held)
                whole_bytes[message.fragment] = len(frame)
        assert len(chain[0]) == 16  # the stream named its chain

        # a learner at cadence 2 is sent only the versions it adopts: whole, in bf16, as with the bf16 codec
        held_client = job.client("L1")
        held_client.register("L1", 1, "region-L1", 2)
        held_stream = held_client.fragments([-1] * 4, [""])
        rounded = list(itertools.islice((f for f in held_stream if f), 4))
        held_stream.close()
        held_client.close()
        for frame in rounded:
            message = decode_fragment(frame)[0]
            assert len(frame) < 0.55 * whole_bytes[message.fragment] and unpack(frame).codec == "bf16"
        assert pusher.push(encode_update(make_update(assembly, fragment=0, base=0), "int4", 64), 0)["status"] == "accepted"
        frame = next(f for f in stream if f)
        assert unpack(frame).meta["base"] == 0 and len(frame) < 0.3 * whole_bytes[0]  # the bootstrap was exact: fp32
        message, held[0] = receive(frame, held)
        stream.close()
        served = decode_fragment(pusher.http.get(f"{job.url}/v1/fragments/0").content)[0]  # what a joining learner gets
        assert message.version == served.version == 1
        assert all(torch.equal(message.tensors[n], served.tensors[n]) for n in served.tensors)  # the same bits

        # versions of another chain (a syncer that restarted since): whole ones, which hold the new chain's bits
        other = subscriber.fragments([1, 0, 0, 0], ["0123456789abcdef"])
        assert pusher.push(encode_update(make_update(assembly, fragment=0, base=1), "int4", 64), 0)["status"] == "accepted"
        frame = next(f for f in other if f)
        assert "base" not in unpack(frame).meta and decode_fragment(frame)[0].version == 2
        other.close()
    finally:
        for client in (subscriber, pusher):
            client.close()
        job.stop_all()


@pytest.mark.slow
def test_learners_train_on_int8_deltas_with_fewer_bytes_down_and_every_token_accounted(tmp_path: Path) -> None:
    """The same two-learner job with bf16 versions and with int8 deltas, real processes: past their bootstrap
    (whole: bf16, or fp32 for a chain) the learners' downlink bytes fall to about half, and the books balance."""
    down, bpb = {}, {}
    for codec, bootstrap in (("bf16", "bf16"), (DELTA, "fp32")):
        config = replace(small_job(learners=2, tokens=80_000), down_codec=codec)
        whole = sync_traffic(replace(config, down_codec=bootstrap)).down_bytes  # every fragment once
        job = Job.create(tmp_path / codec, config)
        try:
            job.start_syncer("--linger", "30")  # it is asked for its summary after the learners exit; stop_all ends it
            for i in range(2):
                job.start_learner(f"L{i}")
            job.wait_learners()
            status = job.wait_for(lambda s: s["job"]["phase"] == "finished", 120, "the job to finish")
            summaries = [job.summary(f"L{i}") for i in range(2)]
            assert all(s["reason"] == FINISHED for s in summaries)
            tokens = status["job"]["summary"]["tokens"]
            assert tokens["pending"] == 0 and status["ledger"]["balanced"]
            assert tokens["merged"] + tokens["late_merged"] + tokens["dropped"] + tokens["rejected"] == tokens["received"]
            down[codec] = sum(s["bytes_down"] - whole for s in summaries) / sum(s["step"] for s in summaries)
            bpb[codec] = status["job"]["summary"]["val_bpb"]
        finally:
            job.stop_all()
    assert 0.4 < down[DELTA] / down["bf16"] < 0.62, down
    # Real processes' timing moves val_bpb: 4.34-4.60 on a quiet machine for either codec, and one CI run gave
    # 4.90 against 4.40. Here: the learners trained on what they adopted (broken versions give ~8 or NaN); the
    # codecs' quality is compared in the virtual cluster below, where the schedule is the same for both.
    assert bpb[DELTA] < 1.25 * bpb["bf16"], bpb


# -- in the virtual cluster ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_virtual_cluster_on_deltas_moves_fewer_bytes_down_and_its_tapes_replay_bit_for_bit(tmp_path: Path) -> None:
    """Two shards, a learner at cadence 2 (sent only the versions it adopts: whole ones) and one that fails and
    rejoins (a bootstrap mid-chain): the learners adopt the chain's bits, so the tapes replay exactly, and the model
    is as good as with bf16 versions on the same schedule."""
    outage = Outage(learner=2, at=6.0, duration=5.0)
    cluster = ClusterConfig(speeds=(1.0, 0.6, 1.3), cadences=(1, 2, 1), outages=(outage,), shards=2)
    runs = {}
    for codec in ("bf16", DELTA):
        config = small_run(tokens=40_000, learners=3, cluster=cluster, down_codec=codec)
        runs[codec] = train_decoupled(config, tmp_path / f"{codec}.jsonl")
    joins = 3 + 1  # each learner's bootstrap, and L2's again after its outage: whole (fp32 for a chain)
    steady = {
        codec: runs[codec]["bytes_down"] - joins * sync_traffic(replace(config, down_codec=whole)).down_bytes
        for codec, whole in (("bf16", "bf16"), (DELTA, "fp32"))
    }
    ratio = steady[DELTA] / steady["bf16"]
    assert 0.4 < ratio < 0.62, ratio  # measured: 0.51
    assert abs(runs[DELTA]["val_bpb"] - runs["bf16"]["val_bpb"]) < 0.03 * runs["bf16"]["val_bpb"]  # measured: 4.557, 4.514
    assert runs[DELTA]["bytes_up"] > 0 and runs[DELTA]["params_sha256"] != runs["bf16"]["params_sha256"]  # it adopts other bits
    replayed = replay_tapes([Path(p) for p in runs[DELTA]["tapes"]])
    assert replayed["match"] and replayed["params_sha256"] == runs[DELTA]["params_sha256"]

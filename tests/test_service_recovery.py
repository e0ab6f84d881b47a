"""Crash recovery of the syncer runtime: snapshot + write-ahead log rebuild exactly what was acknowledged.

The runtime runs in-process here with real files; the kill -9 of a real
process is in test_service_e2e.py.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ddctl_agents.core.messages import Update, decode_update, encode_update
from ddctl_agents.core.packed import BYTES_PER_VALUE, PackedSum
from ddctl_agents.core.syncer import Synchronizer
from ddctl_agents.core.syncer_state import STATE_LIMITS, SyncerState, capture, load, restore
from ddctl_agents.errors import ConfigError
from ddctl_agents.service import history
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.checksum import params_sha256
from tests.builders import small_run

_ids = itertools.count()


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(small_run(learners=2))


def frame_for(rt: SyncerRuntime, learner: str, p: int, value: float, update_id: str | None = None) -> bytes:
    tensors = {n: torch.full_like(t, value) for n, t in rt.syncer.fragments[p].items()}
    update = Update(
        learner=learner,
        fragment=p,
        base_version=rt.syncer.versions[p],
        update_id=update_id or f"{learner}.1.{next(_ids)}",
        step=8,
        c_steps=8,
        c_tokens=4096,
        tensors=tensors,
    )
    return encode_update(update, "int4", 64)


async def settle(rt: SyncerRuntime, rounds: int) -> None:
    for _ in range(200):
        if rt.syncer.rounds_closed >= rounds:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"only {rt.syncer.rounds_closed} rounds closed, wanted {rounds}")


def crash(rt: SyncerRuntime) -> None:
    """Stop without any shutdown work: what was not made durable is gone."""
    for task in rt._tasks:
        task.cancel()
    assert rt.wal is not None and rt.tape is not None
    rt.wal._file.close()
    rt.tape._file.close()


def fingerprint(rt: SyncerRuntime) -> dict[str, Any]:
    s = rt.syncer
    return {
        "versions": list(s.versions),
        "rounds": s.rounds_closed,
        "ledger": vars(s.ledger).copy() if hasattr(s.ledger, "__dict__") else repr(s.ledger),
        "params": params_sha256(s.global_params()),
        "buffers": params_sha256({f"{p}/{n}": t for p, b in enumerate(s.buffers) for n, t in b.items()}),
        "live": dict(s.live),
        "pending": [sorted(r.fresh) for r in s.rounds],
        "clock": dict(s.clock),
    }


def test_restart_rebuilds_exactly_the_acknowledged_state(tmp_path: Path, assembly: Assembly) -> None:
    settings = ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600)

    async def before_crash() -> tuple[dict[str, Any], str, bytes, str]:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        named = (await rt.register("L0", 1, "a"))["history"]  # which its versions count in (``service/history.py``)
        await rt.register("L1", 1, "b")
        for value in (0.01, 0.02):
            for learner in ("L0", "L1"):
                await rt.push(learner, frame_for(rt, learner, 0, value))
        await settle(rt, 1)
        await rt.snapshot()  # the snapshot lands between acknowledged events
        await rt.push("L0", frame_for(rt, "L0", 1, 0.03))
        await settle(rt, 2)
        kept = frame_for(rt, "L1", 2, 0.04, update_id="L1.1.kept")
        await rt.register("L2", 5, "c")
        await rt.leave("L2", "left")
        await rt.push("L1", kept)
        result = fingerprint(rt)
        assert rt.tape is not None
        tape = rt.tape.path.read_bytes()
        crash(rt)
        return result, "L1.1.kept", tape, named

    async def after_restart(replay_id: str) -> tuple[dict[str, Any], dict[str, Any], str, bytes, str]:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        got = fingerprint(rt)
        recovered = dict(rt.recovered)
        again = frame_for(rt, "L1", 2, 0.04, update_id=replay_id)
        _, ack = await rt.push("L1", again)
        assert rt.tape is not None
        tape = rt.tape.path.read_bytes()
        named = (await rt.register("L3", 1, "d"))["history"]
        await rt.stop()
        return got, recovered, ack.status, tape, named

    want, replay_id, tape_before, named_before = asyncio.run(before_crash())
    got, recovered, status, tape_after, named_after = asyncio.run(after_restart(replay_id))
    assert named_before == named_after == (tmp_path / history.FILE).read_text().strip()  # recovered: the same history
    assert got == want
    assert recovered["snapshot"] is True and recovered["replayed"] >= 4
    assert status == "duplicate"  # the dedup window survived the crash
    assert tape_after.startswith(tape_before)  # the tape was rebuilt record for record


def test_a_state_dir_of_another_job_is_refused(tmp_path: Path, assembly: Assembly) -> None:
    async def first() -> None:
        rt = SyncerRuntime(assembly, ServiceSettings(state_dir=tmp_path))
        await rt.start()
        await rt.stop()

    async def other() -> None:
        rt = SyncerRuntime(Assembly.build(small_run(learners=3)), ServiceSettings(state_dir=tmp_path))
        try:
            await rt.start()
        finally:
            for pool in (rt._core, rt.io, rt._work):
                pool.shutdown()

    asyncio.run(first())
    with pytest.raises(ConfigError, match="another job"):
        asyncio.run(other())


def test_a_snapshot_keeps_pending_updates_packed_so_the_restored_round_merges_bit_for_bit(assembly: Assembly) -> None:
    """Restored decoded, a pending update sent its round down the reference path where the live round took the fused
    one: the recovered model differed in its last bits from the acknowledged one (CI: 1 in 25 under load)."""
    live = assembly.new_syncer()
    for learner in ("L0", "L1"):
        live.register(0.0, learner, 1)

    def packed_update(learner: str, seed: int) -> tuple[Update, int]:
        g = torch.Generator().manual_seed(seed)
        tensors = {n: torch.randn(t.shape, generator=g) * 0.01 for n, t in live.fragments[0].items()}
        update = Update(learner=learner, fragment=0, base_version=live.versions[0], update_id=f"{learner}.{seed}",
                        step=8 * seed, c_steps=8, c_tokens=4096 - 64 * seed, tensors=tensors)  # fmt: skip
        body = encode_update(update, "int4", 64)
        return decode_update(body, STATE_LIMITS)[0], len(body)

    for learner, seed in (("L0", 1), ("L0", 2)):  # one learner's two updates: a PackedSum
        ack = live.receive(1.0, *packed_update(learner, seed))[0]
        assert ack.status == "accepted", ack
    state = load(capture(live, {}).to_bytes())
    assert [len(c["packed"]) for c in state.meta["rounds"][0]["fresh"]] == [2]  # kept as the two frames came
    again = assembly.new_syncer()
    restore(again, state)
    [kept] = again.rounds[0].fresh.values()
    assert isinstance(kept.tensors, PackedSum) and len(kept.tensors.parts) == 2
    last = packed_update("L1", 3)
    for syncer in (live, again):
        syncer.receive(2.0, *last)
        syncer.close_round(3.0, 0, "quorum", "")
    assert live.versions == again.versions and live.rounds_closed == again.rounds_closed == 1
    assert params_sha256(again.global_params()) == params_sha256(live.global_params())
    assert params_sha256({f"{n}": t for n, t in again.buffers[0].items()}) == params_sha256(dict(live.buffers[0]))


def test_a_snapshots_packed_update_that_does_not_fit_its_fragment_is_refused(assembly: Assembly) -> None:
    live = assembly.new_syncer()
    live.register(0.0, "L0", 1)
    tensors = {n: torch.full(t.shape, 0.01) for n, t in live.fragments[0].items()}
    update = Update(learner="L0", fragment=0, base_version=0, update_id="L0.x", step=8, c_steps=8, c_tokens=4096, tensors=tensors)
    live.receive(1.0, *decode_update(encode_update(update, "int4", 64), STATE_LIMITS)[:1], 1)
    state = capture(live, {})
    [name] = [k for k in state.tensors if k.startswith("k/0/fresh/L0/0/")][:1]
    values = state.tensors[name]
    for broken in (values[:-1], values + 0.5, values * 0 + (1 << 24), values * 0 - 1):
        with pytest.raises(ValueError, match="not the .* bytes its record says"):
            restore(assembly.new_syncer(), SyncerState(meta=state.meta, tensors={**state.tensors, name: broken}))
    # in blocks of 72 a tensor's bytes need not be a multiple of three: its last value is padded, with zero bytes
    state = capture(packed_round(assembly, learners=1, block=72), {})
    [spec] = state.meta["rounds"][0]["fresh"][0]["packed"]
    n = next(n for n, (_, _, nbytes, _) in spec.items() if nbytes % BYTES_PER_VALUE)
    padded = state.tensors[f"k/0/fresh/L0/0/{n}"].clone()
    padded[-1] += 1 << 16  # the third byte of the last value: padding
    with pytest.raises(ValueError, match="not the .* bytes its record says"):
        restore(assembly.new_syncer(), SyncerState(meta=state.meta, tensors={**state.tensors, f"k/0/fresh/L0/0/{n}": padded}))
    restore(assembly.new_syncer(), state)  # unbroken, it restores
    good = list(spec[n])
    spec[n][3] = 2
    with pytest.raises(ValueError, match="2 bytes per value; 1 or 3 are read"):
        restore(assembly.new_syncer(), state)
    # a record of another length or type, or a byte count that is not a whole number, is named as such
    shapeless = "is not \\[codec, block, bytes"
    cases = [(good[:2], shapeless), ([*good, 3], shapeless), (7, "7 is not"), ([*good[:2], float(good[2]), 3], "[.]0 bytes of")]
    for record, why in cases:
        spec[n] = record
        with pytest.raises(ValueError, match=why):
            restore(assembly.new_syncer(), state)


def packed_round(assembly: Assembly, learners: int, block: int = 64) -> Synchronizer:
    """A syncer holding one int4 update per learner for fragment 0, its round still open."""
    live = assembly.new_syncer()
    for m in range(learners):
        live.register(0.0, f"L{m}", 1)
        g = torch.Generator().manual_seed(m)
        tensors = {n: torch.randn(t.shape, generator=g) * 0.01 for n, t in live.fragments[0].items()}
        update = Update(learner=f"L{m}", fragment=0, base_version=0, update_id=f"L{m}.0", step=8, c_steps=8,
                        c_tokens=4096, tensors=tensors)  # fmt: skip
        body = encode_update(update, "int4", block)
        assert live.receive(1.0, decode_update(body, STATE_LIMITS)[0], len(body))[0].status == "accepted"
    return live


def test_a_snapshot_keeps_three_bytes_of_a_pending_update_to_a_value_and_reads_the_one_byte_layout_of_older_ones(
    assembly: Assembly,
) -> None:
    live = packed_round(assembly, learners=2)
    state = capture(live, {})
    codes = {k: t for k, t in state.tensors.items() if k.startswith("k/")}
    wire = sum(len(p.buffer) for c in live.rounds[0].fresh.values() for p in c.tensors.packed.values())
    # every byte of the two updates is kept, three to a float32 value (each tensor's last value padded)
    assert wire <= sum(4 * t.numel() for t in codes.values()) * BYTES_PER_VALUE / 4 < wire + BYTES_PER_VALUE * len(codes)
    # a snapshot from before (one byte to a value, no bytes-per-value in its record) restores to the same round
    old = SyncerState(meta=copy.deepcopy(state.meta), tensors=dict(state.tensors))
    for kept in old.meta["rounds"][0]["fresh"]:
        for part, spec in enumerate(kept["packed"]):
            for n, (codec, block, nbytes, _) in spec.items():
                key = f"k/0/fresh/{kept['learner']}/{part}/{n}"
                raw = live.rounds[0].fresh[kept["learner"]].tensors.packed[n].buffer
                assert old.tensors[key].numel() < nbytes  # the new layout, which this replaces
                old.tensors[key] = torch.from_numpy(raw.astype(np.float32))
                spec[n] = [codec, block, nbytes]
    for snapshot in (state, old, load(capture(live, {}).to_bytes())):
        again = assembly.new_syncer()
        restore(again, snapshot)
        for learner, c in live.rounds[0].fresh.items():
            kept = again.rounds[0].fresh[learner].tensors
            assert {n: bytes(p.buffer) for n, p in kept.packed.items()} == {
                n: bytes(p.buffer) for n, p in c.tensors.packed.items()
            }
        again.close_round(2.0, 0, "quorum", "")
        other = packed_round(assembly, learners=2)
        other.close_round(2.0, 0, "quorum", "")
        assert params_sha256(again.global_params()) == params_sha256(other.global_params())

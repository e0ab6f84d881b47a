"""Recovery never bricks: bad log records are set aside with their reason, bad snapshots fall back.

Each bad record below is one the live path could have written: an older build
acknowledged poisoned updates (finding 1 and 2 of issue 11), a bug or a disk
could leave malformed metadata or payloads. The syncer must come up with
everything else, exactly as it was.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from ddctl_agents.core.messages import Update, encode_update
from ddctl_agents.errors import ConfigError
from ddctl_agents.service.recovery import QUARANTINE
from ddctl_agents.service.runtime import SyncerRuntime
from ddctl_agents.service.settings import ServiceSettings
from ddctl_agents.service.snapshots import snapshots
from ddctl_agents.service.wal import Wal, read_segment
from ddctl_agents.train.assembly import Assembly
from tests.builders import small_run
from tests.test_service_recovery import crash, fingerprint, frame_for, settle


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(small_run(learners=2))


def poisoned(rt: SyncerRuntime, p: int, *, value: float = 1e-3, transpose: bool = False, base: int | None = None) -> bytes:
    tensors = {n: torch.full_like(t.T if transpose and t.ndim == 2 else t, value) for n, t in rt.syncer.fragments[p].items()}
    update = Update(
        learner="L1", fragment=p, base_version=rt.syncer.versions[p] if base is None else base, update_id=f"L1.bad.{p}.{value}",
        step=8, c_steps=8, c_tokens=4096, tensors=tensors,
    )  # fmt: skip
    return encode_update(update, "int4", 64)


def bad_records(rt: SyncerRuntime) -> list[tuple[dict[str, Any], bytes]]:
    """(meta, payload) of each kind of record recovery must set aside; written after a crash, as a build could have."""
    two_d = next(p for p in range(rt.syncer.fragmentation.count) if any(t.ndim == 2 for t in rt.syncer.fragments[p].values()))
    frame = poisoned(rt, 1, value=0.25)
    t = rt.clock()
    return [
        ({"kind": "update", "t": t, "nbytes": 1}, poisoned(rt, 1, value=2e38)),  # finite but huge
        ({"kind": "update", "t": t, "nbytes": 1}, poisoned(rt, two_d, transpose=True, base=rt.syncer.versions[two_d] - 1)),
        ({"kind": "close", "t": t, "fragment": 1, "cause": "grace_off", "reason": "r", "grace_s": 0.0}, b""),  # nothing to close
        ({"kind": "update", "t": t, "nbytes": 1}, frame[:-9] + b"garbage!!"),  # a payload that is not a frame
        ({"kind": "join", "t": t, "learner": "L9"}, b""),  # a field missing
        ({"kind": "teleport", "t": t}, b""),  # a kind that does not exist
        ({"kind": "close", "t": t, "fragment": "0", "cause": "c", "reason": "r", "grace_s": 0.0}, b""),  # a wrong type
        ({"kind": "close", "t": t, "fragment": 99, "cause": "c", "reason": "r", "grace_s": 0.0}, b""),  # no such fragment
        ({"kind": "join", "t": t, "learner": "bad\nname", "incarnation": 1, "start_step": 0}, b""),  # a forged identity
        ({"kind": "readmit", "t": t, "learner": "L0", "extra": 1}, b""),  # an unknown field
    ]


def test_each_kind_of_bad_record_is_set_aside_and_the_syncer_comes_up_as_it_was(tmp_path: Path, assembly: Assembly) -> None:
    settings = ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600)

    async def before() -> tuple[dict[str, Any], int]:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        for m in ("L0", "L1"):
            await rt.register(m, 1, "r")
        for p in range(rt.syncer.fragmentation.count):
            await rt.push("L0", frame_for(rt, "L0", p, 0.01))
        await settle(rt, rt.syncer.fragmentation.count)
        records = bad_records(rt)
        want = fingerprint(rt)
        crash(rt)
        wal = Wal(tmp_path / "wal")
        for meta, payload in records:
            wal.append(meta, payload)
        wal.close()
        return want, len(records)

    async def after() -> tuple[dict[str, Any], dict[str, Any], int]:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        got, recovered = fingerprint(rt), dict(rt.recovered)
        await rt.push("L0", frame_for(rt, "L0", 0, 0.01))  # and it merges as ever
        await settle(rt, rt.syncer.rounds_closed + 1)
        balanced = rt.syncer.ledger.balanced()
        version = rt.syncer.versions[0]
        await rt.stop()
        assert balanced
        return got, recovered, version

    want, written = asyncio.run(before())
    got, recovered, version = asyncio.run(after())
    assert got == want
    assert recovered["quarantined"] == written and recovered["replayed"] >= 4
    assert version == want["versions"][0] + 1
    aside = list(read_segment(tmp_path / QUARANTINE))
    assert len(aside) == written
    reasons = [r.meta["set_aside"] for r in aside]
    assert "moves a parameter by" in reasons[0] and "(" in reasons[1] and "float32" in reasons[1]
    assert "no contributions" in reasons[2] and "WireError" in reasons[3]
    assert all(r.meta["at"].count(":") == 1 for r in aside)
    assert aside[0].payload.startswith(b"DDLW")  # the record itself is kept, payload and all, for a post-mortem


def test_an_unreadable_snapshot_falls_back_to_the_previous_one(tmp_path: Path, assembly: Assembly) -> None:
    settings = ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600)

    async def before() -> dict[str, Any]:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        await rt.register("L0", 1, "r")
        for value in (0.01, 0.02, 0.03):
            await rt.push("L0", frame_for(rt, "L0", 0, value))
            await settle(rt, rt.syncer.rounds_closed + 1)
            await rt.snapshot()
        await rt.push("L0", frame_for(rt, "L0", 1, 0.04))
        want = fingerprint(rt)
        crash(rt)
        return want

    async def after() -> tuple[dict[str, Any], dict[str, Any]]:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        got, recovered = fingerprint(rt), dict(rt.recovered)
        await rt.stop()
        return got, recovered

    want = asyncio.run(before())
    kept = snapshots(tmp_path)
    assert len(kept) == 2  # the newest two are kept
    newest = kept[0][1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    got, recovered = asyncio.run(after())
    assert got == want
    assert len(recovered["snapshots_set_aside"]) == 1 and "checksum" in recovered["snapshots_set_aside"][0]
    assert [p.name.split("-", 1)[1] for p in (tmp_path / "quarantine").iterdir()] == [newest.name]


def test_no_readable_snapshot_and_no_full_log_is_a_clear_refusal(tmp_path: Path, assembly: Assembly) -> None:
    settings = ServiceSettings(state_dir=tmp_path, snapshot_every_s=3600)

    async def run() -> None:
        rt = SyncerRuntime(assembly, settings)
        await rt.start()
        for _ in range(3):
            await rt.snapshot()
        crash(rt)

    asyncio.run(run())
    for _, path in snapshots(tmp_path):
        path.write_bytes(b"not a snapshot")

    async def restart() -> None:
        rt = SyncerRuntime(assembly, settings)
        try:
            await rt.start()
        finally:
            for pool in (rt._core, rt.io, rt._work):
                pool.shutdown()

    with pytest.raises(ConfigError, match="cannot be rebuilt"):
        asyncio.run(restart())


def test_a_record_too_large_to_read_back_is_refused_before_it_is_written(tmp_path: Path) -> None:
    from ddctl_agents.errors import LogError
    from ddctl_agents.service.wal import MAX_META

    wal = Wal(tmp_path)
    with pytest.raises(LogError, match="exceeds"):
        wal.append({"kind": "leave", "reason": "x" * MAX_META})
    wal.append({"kind": "ok"})
    wal.close()
    assert [r.meta for r in read_segment(tmp_path / "00000000.wal")] == [{"kind": "ok"}]

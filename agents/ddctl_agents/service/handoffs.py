"""Moving a fragment between shards, as the service carries it out: logged at both ends, durable before answered.

``ddctl syncer move`` asks the owner to hand the fragment out (``POST
/v1/admin/handoff/out``): the shard closes the fragment's open round, logs the
handoff, moves its map and answers with the export once the log record is on
disk. From then it refuses the fragment's updates with the new owner (409), and
learners retry there. The coordinator gives the export to the new owner (``POST
/v1/admin/handoff/in``), which logs it (the export rides as the record's
payload), installs it and publishes the fragment's version. Either end may
crash at any point: asking again is safe at both ends (an answered hand-out is
answered again from the frozen fragment; an installed export is installed once),
and each end's log replays what it had done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddctl_agents.core.effects import Effect, Record, Send
from ddctl_agents.core.shard_syncer import ShardSynchronizer
from ddctl_agents.errors import NotFound
from ddctl_agents.service.log_records import HandoffInEntry, HandoffOutEntry

if TYPE_CHECKING:
    from ddctl_agents.service.runtime import SyncerRuntime


async def hand_out(rt: SyncerRuntime, fragment: int, to: str, epoch: int) -> bytes:
    """Give ``fragment`` to shard ``to`` at map epoch ``epoch``; the export, once the handoff is durable here."""
    data, position = await rt.view(lambda r: _out(r, fragment, to, epoch))
    await rt.commit_to(position)
    return data


async def hand_in(rt: SyncerRuntime, data: bytes) -> dict[str, Any]:
    """Take the fragment another shard exported; what was installed, once durable and published."""
    sends, position, answer = await rt.view(lambda r: _in(r, data))
    await rt.commit_to(position)
    for message in sends:
        await rt.publish(message)
    return answer


def _shard(rt: SyncerRuntime) -> ShardSynchronizer:
    if not isinstance(rt.syncer, ShardSynchronizer):
        raise NotFound("this synchronizer is not sharded: it owns every fragment, and none can move")
    return rt.syncer


def _out(rt: SyncerRuntime, p: int, to: str, epoch: int) -> tuple[bytes, int]:
    assert rt.wal is not None
    syncer, now = _shard(rt), rt.clock()
    effects = syncer.hand_out(now, p, to, epoch)
    if effects:  # [] when this handoff had happened already: answer it again
        rt.wal.append(HandoffOutEntry(t=now, fragment=p, to=to, epoch=epoch).model_dump())
        _applied(rt, now, effects)
    return syncer.export(p), rt.wal.appended


def _in(rt: SyncerRuntime, data: bytes) -> tuple[list[Any], int, dict[str, Any]]:
    assert rt.wal is not None
    syncer, now = _shard(rt), rt.clock()
    effects = syncer.hand_in(now, data)
    if effects:
        rt.wal.append(HandoffInEntry(t=now, nbytes=len(data)).model_dump(), data)
        _applied(rt, now, effects)
    record = next((e.entry for e in effects if isinstance(e, Record) and e.entry["type"] == "handoff"), None)
    sends = [e.message for e in effects if isinstance(e, Send)]
    answer = {"installed": bool(effects), "epoch": syncer.role.map.epoch, "owned": sorted(syncer.role.owned)}
    return sends, rt.wal.appended, answer | ({"fragment": record["fragment"], "version": record["version"]} if record else {})


def _applied(rt: SyncerRuntime, now: float, effects: list[Effect]) -> None:
    rt.apply_effects(effects)
    for effect in effects:
        if (entry := getattr(effect, "entry", None)) is not None and entry["type"] == "handoff":
            rt.roster.event(now, "handoff", fragment=entry["fragment"], to=entry["to"], epoch=entry["epoch"])

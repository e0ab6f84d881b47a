"""The write-ahead log's record kinds, written and read back through the same models.

The live syncer writes each state-changing event as one of these (an update's
wire frame rides as the record's payload); recovery validates every record
against them before it touches the core, so a record that a bug, a crash or a
hand edit made malformed is set aside instead of replayed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from ddctl_agents.service.requests import Cadence, Count, Identity

Time = Annotated[float, Field(allow_inf_nan=False)]
Text = Annotated[str, Field(max_length=1000)]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    t: Time


class JoinEntry(_Entry):
    kind: Literal["join"] = "join"
    learner: Identity
    incarnation: Count
    start_step: Count
    cadence: Cadence = 1


class LeaveEntry(_Entry):
    kind: Literal["leave"] = "leave"
    learner: Identity
    reason: Text


class UpdateEntry(_Entry):
    """An acknowledged update; its frame is the record's payload."""

    kind: Literal["update"] = "update"
    nbytes: Count


class RejectEntry(_Entry):
    """An update refused for its content: no payload, only what counts against its sender."""

    kind: Literal["reject"] = "reject"
    learner: Identity
    reason: Text


class CloseEntry(_Entry):
    kind: Literal["close"] = "close"
    fragment: Count
    cause: Text
    reason: Text
    grace_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]


class DiscardEntry(_Entry):
    """A round set aside after an unexpected error (its tokens count as rejected)."""

    kind: Literal["discard"] = "discard"
    fragment: Count
    reason: Text


class ReadmitEntry(_Entry):
    kind: Literal["readmit"] = "readmit"
    learner: Identity


class CutEntry(_Entry):
    """A global checkpoint's marker (``service/cuts.py``): the clock's checkpoint epoch moves to ``epoch``."""

    kind: Literal["cut"] = "cut"
    epoch: Count
    trigger: Literal["marker", "update"]


class HandoffOutEntry(_Entry):
    """This shard gave a fragment to another (``ShardSynchronizer.hand_out``; replaying it closes the same round)."""

    kind: Literal["handoff_out"] = "handoff_out"
    fragment: Count
    to: Annotated[str, Field(pattern=r"^S[0-9]{1,3}$")]
    epoch: Count


class HandoffInEntry(_Entry):
    """This shard took a fragment another exported; the export is the record's payload."""

    kind: Literal["handoff_in"] = "handoff_in"
    nbytes: Count


Entry = Annotated[
    JoinEntry
    | LeaveEntry
    | UpdateEntry
    | RejectEntry
    | CloseEntry
    | DiscardEntry
    | ReadmitEntry
    | CutEntry
    | HandoffOutEntry
    | HandoffInEntry,
    Field(discriminator="kind"),
]
ENTRY: TypeAdapter[Entry] = TypeAdapter(Entry)


def entry_for(now: float, record: dict[str, Any]) -> CloseEntry | DiscardEntry | None:
    """The log entry a tape record of the round loop needs (a close or a discard), if any."""
    if record["type"] == "round":
        return CloseEntry(
            t=now, fragment=record["fragment"], cause=record["cause"], reason=record["reason"], grace_s=record["grace_s"]
        )
    if record["type"] == "fault":
        return DiscardEntry(t=now, fragment=record["fragment"], reason=record["reason"])
    return None

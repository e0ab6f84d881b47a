"""Desired against observed: what to create, replace, retire or terminate, each with its reason (pure).

One decision drives ``up`` (desired = the plan), ``down`` (desired = nothing),
the controller (desired = the run's recorded instances) and ``up --plan``.
Failover lives here and knows no provider: each instance has an ordered list of
placements (its region's zones, then its fallback regions); a provider's
``ProvisionError`` is folded into ``Memory`` by ``remember``: capacity blocks
its zone (or region) for a while, quota its scope, credentials stop that cloud
for good, a transient error retries with capped, jittered backoff. Time comes
in as ``now``; jitter is a hash, so a decision is a function of its inputs.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ddctl.errors import ProvisionError, ProvisionScope

ActionKind = Literal["create", "replace", "retire", "terminate", "wait", "give_up"]
ORDER = {"syncer": 0, "learner": 1}
"""Who is started first: learners need the syncer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    provider: str
    cloud_region: str
    zone: str = ""

    def blocked_by(self, block: Block) -> bool:
        keys = {"cloud": self.provider, "region": f"{self.provider}:{self.cloud_region}"}
        keys["zone"] = f"{keys['region']}/{self.zone}" if self.zone else keys["region"]
        return keys[block.scope] == block.where

    def where(self, scope: ProvisionScope) -> str:
        region = f"{self.provider}:{self.cloud_region}"
        return {"cloud": self.provider, "region": region, "zone": f"{region}/{self.zone}" if self.zone else region}[scope]

    def __str__(self) -> str:
        return f"{self.cloud_region}/{self.zone}" if self.zone else self.cloud_region


@dataclass(frozen=True, slots=True, kw_only=True)
class Desired:
    name: str
    role: str
    placements: tuple[Placement, ...]
    """Where it may run, in the order failover tries them."""
    done: bool = False
    """Its work is finished (a learner's budget): it is never replaced."""
    given_up: bool = False
    """Failover gave it up (its record says so): not started again, though a restarted controller forgot why."""
    group: str = ""
    """The learner whose VMs live and die together ("" or its own name: alone); see ``_gang``."""
    node: int = 0
    """Its place in the group: node 0 is started first (the others meet at its address), and failover decides for it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    name: str
    alive: bool
    finished: bool = False
    """Its exit summary says its budget was done."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    scope: ProvisionScope
    where: str
    until: float
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FailoverConfig:
    """How long each kind of refusal keeps a placement out [ours]."""

    capacity_block_s: float = 600.0
    """A zone (or region) without capacity is tried again after this long."""
    quota_block_s: float = 1800.0
    backoff_first_s: float = 2.0
    backoff_max_s: float = 120.0
    max_config_errors: int = 3
    """A request its provider calls wrong this many times is given up."""
    quick_end_s: float = 600.0
    """An agent that ends this soon after its start, its work not done, may have ended for a reason its next machine
    shares (its settings, its data, a bug): see ``ended``."""
    restart_backoff_first_s: float = 30.0
    """The wait before the start that follows a second quick end in a row; it doubles with each one after."""
    max_quick_ends: int = 5
    """Quick ends in a row after which an agent is given up, not started on yet another machine."""


DEFAULT = FailoverConfig()


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """What failover remembers between passes; ``remember`` returns a new one."""

    blocks: tuple[Block, ...] = ()
    failures: Mapping[str, int] = field(default_factory=dict)
    """Consecutive failed attempts per instance."""
    retry_at: Mapping[str, float] = field(default_factory=dict)
    config_errors: Mapping[str, int] = field(default_factory=dict)
    quick_ends: Mapping[str, int] = field(default_factory=dict)
    """Per instance (or learner over several VMs): its agent's ends in a row that came soon after its start."""
    ends_seen: Mapping[str, float] = field(default_factory=dict)
    """The start of the incarnation whose end was counted last: an end is counted once, however many passes see it."""
    restart_at: Mapping[str, float] = field(default_factory=dict)

    def active(self, now: float) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.until > now)


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    kind: ActionKind
    name: str
    reason: str
    placement: Placement | None = None


def reconcile(
    desired: Sequence[Desired],
    observed: Sequence[Observed],
    now: float,
    memory: Memory | None = None,
    config: FailoverConfig | None = None,
) -> list[Action]:
    """The actions that bring ``observed`` to ``desired``, syncer first, each with why."""
    memory = memory or Memory()
    seen = {o.name: o for o in observed}
    wanted = {d.name for d in desired}
    actions = [
        Action(kind="terminate", name=o.name, reason=f"{o.name} is not part of the run's plan")
        for o in sorted(observed, key=lambda o: o.name)
        if o.name not in wanted
    ]
    gangs: dict[str, list[Desired]] = {}
    for d in desired:
        gangs.setdefault(d.group or d.name, []).append(d)
    for members in sorted(gangs.values(), key=lambda g: (min(ORDER.get(d.role, 2) for d in g), g[0].group or g[0].name)):
        if len(members) > 1:
            actions += _gang(sorted(members, key=lambda d: d.node), seen, now, memory, config or DEFAULT)
            continue
        [d] = members
        o = seen.get(d.name)
        if o is not None and o.alive:
            continue
        if d.done or (o is not None and o.finished):
            if o is not None:
                actions.append(Action(kind="retire", name=d.name, reason=f"{d.name} finished its work; collecting its log"))
            continue
        if o is not None:
            actions.append(Action(kind="retire", name=d.name, reason=f"{d.name}'s agent ended; collecting its log"))
        actions.append(_start(d, o is not None, now, memory, config or DEFAULT))
    return actions


def _gang(
    members: list[Desired], seen: Mapping[str, Observed], now: float, memory: Memory, config: FailoverConfig
) -> list[Action]:
    """One learner over several VMs: its ranks are one torchrun job, so it lives and dies as one.

    Any VM gone before the work is done takes the rest down with it (they would only wait out a
    collective timeout) and all are started again, node 0 first, at one placement: node 0's, which
    failover picks as for a lone instance under the group's name (where refusals are remembered)."""
    group, observed = members[0].group, [seen.get(d.name) for d in members]
    if all(o is not None and o.alive for o in observed):
        return []
    ended = [d.name for d, o in zip(members, observed, strict=True) if o is not None and not o.alive]
    if any(d.done for d in members) or any(o is not None and o.finished for o in observed):
        why = f"{group} finished its work; collecting its log"
        return [Action(kind="retire", name=name, reason=why) for name in ended]
    down = [d.name for d, o in zip(members, observed, strict=True) if o is None or not o.alive]
    actions = [Action(kind="retire", name=name, reason=f"{name}'s agent ended; collecting its log") for name in ended]
    lost = f"{group} lost {', '.join(down)}; its VMs are replaced as one"
    actions += [
        Action(kind="terminate", name=d.name, reason=lost)
        for d, o in zip(members, observed, strict=True)
        if o is not None and o.alive
    ]
    existed = any(o is not None for o in observed)
    lead = _start(replace(members[0], name=group), existed, now, memory, config)
    if lead.kind not in ("create", "replace"):
        return [*actions, replace(lead, name=members[0].name)]
    return actions + [
        replace(lead, name=d.name, reason=lead.reason if d.node == 0 else f"{lead.reason} (node {d.node} of {group})")
        for d in members
    ]


def _start(d: Desired, existed: bool, now: float, memory: Memory, config: FailoverConfig) -> Action:
    verb: ActionKind = "replace" if existed else "create"
    why = f"{d.name} ended before its work was done" if existed else f"{d.name} is in the plan and not running"
    if d.given_up:
        return Action(kind="give_up", name=d.name, reason=f"{d.name} was given up (see the event log); not started again")
    if memory.config_errors.get(d.name, 0) >= config.max_config_errors:
        refused = f"{d.name}: its request was refused as invalid {config.max_config_errors} times"
        return Action(kind="give_up", name=d.name, reason=refused)
    quick = memory.quick_ends.get(d.name, 0)
    soon = f"its agent ended within {config.quick_end_s:.0f}s of its start {quick} times in a row"
    if quick >= config.max_quick_ends:
        given = (
            f"{d.name}: {soon}; not started again (see `ddctl logs {d.name}`; `ddctl stop` ends the job with the others' work)"
        )
        return Action(kind="give_up", name=d.name, reason=given)
    if (restart := memory.restart_at.get(d.name, 0.0)) > now:
        return Action(kind="wait", name=d.name, reason=f"{d.name}: {soon}, so it starts again at {_clock(restart)}")
    retry = memory.retry_at.get(d.name, 0.0)
    if retry > now:
        return Action(kind="wait", name=d.name, reason=f"{why}; retrying at {_clock(retry)} after transient errors")
    blocks = memory.active(now)
    for placement in d.placements:
        blocking = [b for b in blocks if placement.blocked_by(b)]
        if not blocking:
            failed = [str(p) for p in d.placements[: d.placements.index(placement)]]
            moved = f"; {', '.join(failed)} blocked, trying {placement}" if failed else ""
            return Action(kind=verb, name=d.name, reason=f"{why}{moved}", placement=placement)
    forever = [b for b in blocks if b.until == float("inf")]
    if forever and all(any(p.blocked_by(b) for b in forever) for p in d.placements):
        return Action(kind="give_up", name=d.name, reason=f"{d.name}: no placement can work: {forever[0].reason}")
    soonest = min((b.until for b in blocks if any(p.blocked_by(b) for p in d.placements)), default=now)
    reasons = "; ".join(sorted({b.reason for b in blocks if any(p.blocked_by(b) for p in d.placements)}))
    blocked = f"{why}; every placement is blocked ({reasons}); next try at {_clock(soonest)}"
    return Action(kind="wait", name=d.name, reason=blocked)


def remember(
    memory: Memory, action: Action, error: ProvisionError | None, now: float, config: FailoverConfig | None = None
) -> Memory:
    """Fold the outcome of a create/replace into what failover knows."""
    config, name = config or DEFAULT, action.name
    if error is None:
        return replace(
            memory,
            failures={k: v for k, v in memory.failures.items() if k != name},
            retry_at={k: v for k, v in memory.retry_at.items() if k != name},
        )
    placement = action.placement
    reason = f"{error.kind} ({error.code or 'refused'}) in {error.where or placement}"
    if error.kind == "transient":
        failures = {**memory.failures, name: memory.failures.get(name, 0) + 1}
        return replace(memory, failures=failures, retry_at={**memory.retry_at, name: now + backoff(name, failures[name], config)})
    if error.kind == "config":
        return replace(memory, config_errors={**memory.config_errors, name: memory.config_errors.get(name, 0) + 1})
    if placement is None:
        return memory
    scope: ProvisionScope = "cloud" if error.kind == "credentials" else error.scope
    hold = {"capacity": config.capacity_block_s, "quota": config.quota_block_s}.get(error.kind, float("inf"))
    block = Block(scope=scope, where=placement.where(scope), until=now + hold, reason=reason)
    return replace(memory, blocks=(*memory.active(now), block))


def ended(memory: Memory, name: str, started_at: float, now: float, config: FailoverConfig | None = None) -> Memory:
    """Fold an agent's end before its work was done (its incarnation started at ``started_at``) into what failover
    knows, once per incarnation.

    A spot VM taken back is replaced at once. An agent whose settings or data make it fail (a batch past memory, a
    corpus it cannot read) fails again on every new machine, and replaced at once each time it would churn paid VMs
    for ever. So an end within ``quick_end_s`` of the start counts; from the second in a row the next start waits
    (``restart_backoff_first_s``, doubling), and at ``max_quick_ends`` the agent is given up. A longer life resets
    the count."""
    config = config or DEFAULT
    if memory.ends_seen.get(name) == started_at:
        return memory
    count = memory.quick_ends.get(name, 0) + 1 if now - started_at < config.quick_end_s else 0
    restart = {k: v for k, v in memory.restart_at.items() if k != name}
    if count >= 2:
        base = min(config.restart_backoff_first_s * 2 ** (count - 2), config.quick_end_s)
        restart[name] = now + base * _jitter(name, count)
    return replace(
        memory,
        quick_ends={**memory.quick_ends, name: count},
        ends_seen={**memory.ends_seen, name: started_at},
        restart_at=restart,
    )


def _clock(at: float) -> str:
    """A wait's end as a time of day, not a count of seconds: the reason stays the same for every pass of one wait, so
    the event log says it once (``Controller._act``)."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def _jitter(name: str, attempt: int) -> float:
    """50-100%, from a hash of the name and the attempt: machines that failed together do not retry together."""
    return 0.5 + (zlib.crc32(f"{name}:{attempt}".encode()) % 1000) / 2000


def backoff(name: str, failures: int, config: FailoverConfig | None = None) -> float:
    """Capped exponential backoff with a jitter of 50-100%, from a hash of the name and the attempt."""
    config = config or DEFAULT
    base = min(config.backoff_first_s * 2 ** (failures - 1), config.backoff_max_s)
    return float(base * _jitter(name, failures))

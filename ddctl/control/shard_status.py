"""``ddctl syncer status``: a sharded synchronizer's shards side by side, and the job's figures from all of them.

Each shard's books count its own fragments, so the job's books are their sums
and balance when every shard's do; a learner is one learner whatever number of
shards heard it, so what learners report (tokens trained, the budget) is the
largest any shard saw, never a sum. A fragment's version is its owner's, by the
newest map that claims it. A shard that does not answer is listed as such,
and the figures say they are partial: its fragments, by the newest map a shard
that answered serves, are ``unheard`` (no version known). A fragment in the
middle of a handoff between two shards that answered is claimed by neither: it
is listed under ``handoff`` with the newest version any shard holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ddctl_agents import relay
from ddctl_agents.agent.client import SyncerClient, Unavailable
from ddctl_agents.core import shardmap
from ddctl_agents.core.wire import is_count
from ddctl_agents.errors import AgentError, ConfigError
from ddctl_agents.service.auth import IDENTITY

BOOKS = ("received", "merged", "late_merged", "dropped", "rejected", "pending")
"""The ledger's entries (fragment-tokens): each shard counts its own fragments'."""
PER_LEARNER = ("budget", "planned", "trained")
"""Token figures about learners, which every shard hears in full."""
MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError)
"""What reading a status that does not have the service's shape raises."""


def job_figure(key: str, a: int, b: int) -> int:
    """Two shards' token figures as the job's: the books add up, what learners report is the same learners' (max)."""
    return max(a, b) if key in PER_LEARNER else a + b


def readable(status: Any) -> None:
    """Raises one of MALFORMED unless ``status`` holds every figure the job's are made of, and one version, a count,
    per fragment (a fragment in the middle of a handoff is shown at the newest of them)."""
    summarize([("", status, "")])
    fragments, versions = status["fragments"], status["versions"]
    if not (is_count(fragments) and isinstance(versions, list) and len(versions) == fragments and all(map(is_count, versions))):
        raise ValueError("its versions are not one count in [0, 2**62) per fragment")


def gather(
    urls: Sequence[str], connect: Callable[[str], SyncerClient], check: Callable[[Any], None] | None = readable
) -> list[tuple[str, dict[str, Any] | None, str]]:
    """(url, status or None, why not) for each shard; a status that fails ``check`` counts as no answer, so one
    shard's malformed answer cannot hide the others' figures (None: the caller checks what it reads itself)."""
    out: list[tuple[str, dict[str, Any] | None, str]] = []
    for url in urls:
        client = connect(url)
        try:
            status = client.status()
            if check is not None:
                check(status)
            out.append((url, status, ""))
        except (Unavailable, AgentError) as exc:
            out.append((url, None, str(exc)))
        except MALFORMED as exc:
            out.append((url, None, f"its status is malformed ({type(exc).__name__}: {exc}"[:300] + ")"))
        finally:
            client.close()
    return out


def site_reading(raw: Any) -> dict[str, Any]:
    """A status's ``site``: where the service says it runs and its own reading of that site's link, Mbit/s each way
    (None: not measured yet, or not a positive number)."""
    raw = raw if isinstance(raw, dict) else {}
    mbps = {k: v if isinstance(v := raw.get(k), int | float) and not isinstance(v, bool) and v > 0 else None
            for k in ("up_mbps", "down_mbps")}  # fmt: skip
    return {"name": raw.get("name") if isinstance(raw.get("name"), str) else "", **mbps}


def relay_reading(raw: Any) -> dict[str, dict[str, Any]]:
    """A status's ``relays`` (``service/relay_feeds.py``), each region's feed kept only whole: a region named as an
    identity, streams and bytes counts, ``seen_s_ago`` a finite number of seconds, ``address`` one a learner can dial
    (``relay.address``; absent or "" from a relay that said none), ``learners`` a count (None from a synchronizer that
    does not say); anything else is left out."""
    feeds: dict[str, dict[str, Any]] = {}
    for region, feed in (raw if isinstance(raw, dict) else {}).items():
        if not (isinstance(region, str) and IDENTITY.match(region) and isinstance(feed, dict)):
            continue
        counts = [feed.get(k) for k in ("streams", "bytes")]
        ago = feed.get("seen_s_ago")
        at, serving = feed.get("address", ""), feed.get("learners")
        if not (serving is None or _count(serving)):
            continue
        if all(_count(c) for c in counts) and _seconds(ago) and _dialable(at):
            feeds[region] = {"streams": counts[0], "bytes": counts[1], "seen_s_ago": float(ago), "address": at,  # type: ignore[arg-type]
                             "learners": serving}  # fmt: skip
    return dict(sorted(feeds.items()))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dialable(value: Any) -> bool:
    """ "" or a relay's address exactly as ``relay.address`` writes it."""
    try:
        return value == "" or (isinstance(value, str) and relay.address(value) == value)
    except ValueError:
        return False


def _seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def summarize(answers: Sequence[tuple[str, dict[str, Any] | None, str]]) -> dict[str, Any]:
    """The shards' rows and the job's figures; see the module docstring."""
    rows, claims = [], []
    for url, status, error in answers:
        if status is None:
            rows.append({"url": url, "reachable": False, "error": error})
            continue
        shard = status.get("shard") or {}
        if shard:
            claims += [(int(shard["epoch"]), p, int(status["versions"][p])) for p in shard["owned"]]
        rows.append({
            "url": url, "reachable": True, "shard": shard.get("name"), "epoch": shard.get("epoch"),
            "owned": shard.get("owned"), "rounds": status["rounds"], "live": status["live"],
            "versions": {p: status["versions"][p] for p in shard.get("owned", range(status["fragments"]))},
            "ledger": {k: status["ledger"][k] for k in BOOKS}, "balanced": status["ledger"]["balanced"],
            "phase": status["job"]["phase"], "site": site_reading(status.get("site")),
        })  # fmt: skip
    reached = [s for _, s, _ in answers if s is not None]
    job: dict[str, Any] = {"shards": len(answers), "reachable": len(reached), "partial": len(reached) < len(answers)}
    if reached:
        ledger = {k: sum(int(s["ledger"][k]) for s in reached) for k in BOOKS}
        tokens = {k: sum(int(s["tokens"].get(k, 0)) for s in reached) for k in BOOKS if k in reached[0]["tokens"]}
        tokens |= {k: max(int(s["tokens"].get(k, 0)) for s in reached) for k in PER_LEARNER}
        job |= {
            "rounds": sum(int(s["rounds"]) for s in reached),
            "ledger": ledger,
            "balanced": all(bool(s["ledger"]["balanced"]) for s in reached),
            "tokens": tokens,
            "live": sorted({name for s in reached for name in s["live"]}),
            "phases": sorted({s["job"]["phase"] for s in reached}),
        }
    if claims:  # each fragment's version at the shard that owns it at the newest epoch that claims it
        fragments = int(reached[0]["fragments"])
        newest: dict[int, tuple[int, int]] = {}
        for epoch, p, version in claims:
            if p not in newest or epoch > newest[p][0]:
                newest[p] = (epoch, version)
        job["epoch"] = max(epoch for epoch, _, _ in claims)
        job["unheard"], job["handoff"] = unclaimed(reached, set(newest), everyone=len(reached) == len(answers))
        handing = set(job["handoff"])
        job["versions"] = [
            newest[p][1] if p in newest else newest_held(reached, p) if p in handing else None for p in range(fragments)
        ]
    return {"shards": rows, "job": job}


def unclaimed(reached: Sequence[dict[str, Any]], claimed: set[int], everyone: bool) -> tuple[list[int], list[int]]:
    """The fragments no shard that answered claims, as (unheard, handoff): by the newest map any of them serves, those
    whose owner did not answer (their versions are not known) and those whose owner did (handed out, not yet taken
    in). With no map served (shards too old to serve one) nothing is known about owners: all are handed off when every
    shard answered, and none is known either way when one did not (its owner may be that shard)."""
    maps = [m for s in reached if (m := _served_map(s)) is not None and m.fragments == int(s["fragments"])]
    if not maps:
        return [], [p for p in range(int(reached[0]["fragments"])) if p not in claimed] if everyone else []
    newest = max(maps, key=lambda m: m.epoch)
    heard = {str((s.get("shard") or {}).get("name")) for s in reached}
    free = [p for p in range(newest.fragments) if p not in claimed]
    return [p for p in free if newest.owner(p) not in heard], [p for p in free if newest.owner(p) in heard]


def newest_held(reached: Sequence[dict[str, Any]], p: int) -> int | None:
    """The newest version of fragment ``p`` any shard holds (a count), for one in the middle of a handoff: the giver
    keeps the version it handed out, newer than the taker's copy."""
    held = [v for s in reached for v in (s.get("versions") or [])[p : p + 1] if is_count(v)]
    return max(held, default=None)


def _served_map(status: dict[str, Any]) -> shardmap.ShardMap | None:
    """The shard map a status serves (its ``shard``'s epoch, shard names and owners), if it holds a valid one."""
    shard = status.get("shard") or {}
    try:
        return shardmap.parse({key: shard.get(key) for key in ("epoch", "shards", "owners")})
    except ConfigError:
        return None

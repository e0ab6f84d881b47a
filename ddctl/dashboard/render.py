"""Drawing a dashboard snapshot with rich: learners, the global panel and the event log.

One function of (snapshot, width, height): it fits 80x24 by dropping the
least important columns and rows first, and grows with the terminal. Nothing
here does I/O, so the same snapshot always draws the same screen (the tests
render recorded snapshots and compare).
"""

from __future__ import annotations

import math
import time
from typing import Any, TypeGuard

from rich import box
from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ddctl.dashboard.events import said, sized

SPARK = "▁▂▃▄▅▆▇█"
STATE_STYLE = {
    "training": "green",
    "deploying": "cyan",
    "provisioning": "cyan",
    "rejoining": "yellow",
    "preempted": "red",
    "gone": "red",
    "finished": "blue",
    "suspended": "bold red",
    "given up": "bold red",
}
# (header, key, minimum width to show it): the narrowest terminals keep the first columns only
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("region", "region", 0),
    ("learner", "id", 0),
    ("state", "state", 0),
    ("accelerator", "accelerator", 0),
    ("step", "step", 0),
    ("tok/s", "tokens_per_s", 0),
    ("mfu", "mfu", 0),
    ("loss", "loss", 0),
    ("stale", "staleness", 0),
    ("sends", "cadence", 100),
    ("in fl", "uploads_in_flight", 120),
    ("up", "up_mbps", 0),
    ("down", "down_mbps", 0),
    ("rtt ms", "rtt_ms", 100),
    ("pre", "preemptions", 90),
    ("$/h", "dollars_per_hour", 110),
    ("provider/zone", "where", 130),
)
LEFT_ALIGNED = frozenset({"region", "id", "state", "accelerator", "where"})
SAID_BY_LEARNERS = frozenset({"accelerator", "uploads_in_flight"})
"""Columns shown only where some learner reports the figure (learners older than it do not)."""
DROP_FIRST = (
    "where",
    "uploads_in_flight",
    "dollars_per_hour",
    "preemptions",
    "cadence",
    "accelerator",
    "rtt_ms",
    "staleness",
    "down_mbps",
    "loss",
)
"""The columns a table too wide for its terminal leaves out, least missed first."""


def sparkline(values: list[float], width: int) -> str:
    values = values[-width:]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(SPARK[min(int((v - lo) / span * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)] for v in values)


def _num(value: Any, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


def _pct(value: float | None, missing: str = "-") -> str:
    return missing if value is None else f"{100 * value:.1f}%"


UNKNOWN = "—"
"""A learner's accelerator or MFU nobody reported (a CPU's MFU, an old learner's device)."""


def accelerator_label(name: str, devices: int | None) -> str:
    """One rank's device without its vendor's name, times the ranks when more than one: "H100 80GB HBM3 x8"."""
    if not name:
        return UNKNOWN
    short = name.removeprefix("NVIDIA ")
    return short if (devices or 1) == 1 else f"{short} x{devices}"


def _line(*parts: str | tuple[str, str]) -> Text:
    """One screen row: never wraps, ends in an ellipsis when the terminal is too narrow."""
    return Text.assemble(*parts, no_wrap=True, overflow="ellipsis")


def header(s: dict[str, Any]) -> Text:
    syncer, job = s["syncer"], s.get("job") or {}
    line = _line((s["run"], "bold"), f" · {s['provider']} · ")
    rounds = s["rounds"]
    if syncer["reachable"]:
        line.append("syncer ok", style="green")
        line.append(f" {syncer['age_s']:.1f}s" if syncer["age_s"] is not None else "")
    elif job.get("phase") == "finished":  # the syncer left on purpose: its result is on record
        line.append("finished", style="bold green")
        rounds = rounds or (job.get("summary") or {}).get("rounds") or 0
    elif syncer.get("unusable"):  # it answered, with something that is not a status: not the network's fault
        age = "no usable answer yet" if syncer["age_s"] is None else f"last usable answer {syncer['age_s']:.0f}s ago"
        line.append(f"syncer's answer unusable, {age}: {syncer['error']}", style="bold red")
    else:
        age = "never reached" if syncer["age_s"] is None else f"last answer {syncer['age_s']:.0f}s ago"
        line.append(f"syncer unreachable, {age}: {syncer['error']}", style="bold red")
    rate = "" if s["rounds_per_min"] is None else f" ({s['rounds_per_min']:.0f}/min)"
    line.append(f" · {rounds:,} rounds{rate}")
    bpb = [v for _, v in s["val_bpb"]]
    if bpb:
        line.append(f" · bpb {bpb[-1]:.3f} ")
        line.append(sparkline(bpb, 16), style="magenta")
    return line


def learners_table(s: dict[str, Any], width: int, max_rows: int) -> Table:
    rows = [(region, learner) for region in s["regions"] for learner in sorted(region["learners"], key=_order)]
    visible = rows if len(rows) <= max_rows else rows[: max(max_rows - 1, 0)]
    cells = [{key: _cell(key, region, learner) for _, key, _ in COLUMNS} for region, learner in visible]
    if len(visible) < len(rows):
        cells.append({"region": Text(f"+{len(rows) - len(visible)} more", style="dim"), "id": Text("learners", style="dim")})
    shown = _fit(
        [c for c in COLUMNS if width >= c[2] and (c[1] not in SAID_BY_LEARNERS or _anyone_said(c[1], rows))], cells, width
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False, padding=(0, 1), show_edge=False)
    for title, key, _ in shown:
        table.add_column(title, justify="left" if key in LEFT_ALIGNED else "right", no_wrap=True)
    for row in cells:
        table.add_row(*(row.get(key, Text("")) for _, key, _ in shown))
    return table


def _fit(shown: list[tuple[str, str, int]], cells: list[dict[str, Text]], width: int) -> list[tuple[str, str, int]]:
    """Drop columns in ``DROP_FIRST`` order while the table is wider than the terminal: GPU rates and device
    names are wider than a CPU's, and a column left out reads better than every cell cut to an ellipsis."""

    def natural(columns: list[tuple[str, str, int]]) -> int:
        widths = [max([len(title)] + [row[key].cell_len for row in cells if key in row]) for title, key, _ in columns]
        return sum(widths) + 3 * (len(widths) - 1)  # padding, the box's blank divider, padding

    for key in DROP_FIRST:
        if natural(shown) <= width:
            break
        shown = [c for c in shown if c[1] != key]
    return shown


def _anyone_said(key: str, rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> bool:
    """Whether any learner said ``key`` (what it trains on, its uploads in flight): a fleet of old learners gets no
    column of dashes."""
    return any(learner.get(key) for _, learner in rows)


def _cell(key: str, region: dict[str, Any], learner: dict[str, Any]) -> Text:
    if key == "region":
        return Text(region["name"])
    if key == "state":
        return Text(learner["state"], style=STATE_STYLE.get(learner["state"], ""))
    if key == "where":
        return Text(f"{region['provider']}/{learner['zone'] or '-'}")
    if key == "accelerator":
        return Text(accelerator_label(learner.get("accelerator") or "", learner.get("devices")))
    if key == "mfu":
        return Text(_pct(learner.get("mfu"), UNKNOWN))
    if key == "loss":
        return Text(_num(learner["loss"], 3))
    if key in ("up_mbps", "down_mbps"):
        return Text(_num(learner[key], 0 if (learner[key] or 0) >= 100 else 1))
    if key == "dollars_per_hour":
        return Text(_num(learner[key], 2))
    if key == "cadence":
        return Text(UNKNOWN if learner.get("cadence") is None else f"every {learner['cadence']}H")
    if key == "uploads_in_flight":
        return Text(_num(learner.get(key)))  # a learner too old to say: "-"
    return Text(_num(learner[key], 0))


def _order(learner: dict[str, Any]) -> tuple[int, str]:
    name = learner["id"]
    return (int(name[1:]), name) if name[1:].isdigit() else (1 << 30, name)


def global_lines(s: dict[str, Any], width: int) -> list[Text]:
    versions = [v for v in s["versions"] if v is not None]  # None: unknown (its shard is not answering)
    unknown = f" ({len(s['versions']) - len(versions)} unknown)" if len(versions) < len(s["versions"]) else ""
    first = _line(
        f"P={s['fragments'] or '-'} versions {min(versions, default=0)}..{max(versions, default=0)}{unknown}",
        f" · K={s['quorum'] or '-'} grace {'on' if s['grace'] else 'off'}",
        f" · goodput {_pct(s['goodput'])} · uptime {_pct(s['uptime'])}",
        "" if s["dollars_per_hour"] is None else f" · ${s['dollars_per_hour']:.2f}/h",
    )
    rounds = _line(("rounds ", "dim"))
    for r in reversed(s["recent_rounds"][-6:]):
        grace = f"+{r['grace_s']:.2f}s " if r.get("grace_s") else ""
        why = f" ({r['reason']})" if width >= 140 and r.get("reason") else ""
        rounds.append(f"f{r['fragment']}v{r['version']} {r['cause']} {grace}{len(r.get('admitted', []))} in{why} · ")
    traffic, ledger, tokens = s["bytes"], s["ledger"], s.get("tokens") or {}
    ratio = "" if traffic["ratio"] is None else f" = {100 * traffic['ratio']:.2f}% of"
    sent = _line(f"sent {sized(traffic['sent'])}{ratio} what data-parallel would have: {sized(traffic['data_parallel'])}")
    if site := s.get("site"):
        link = " / ".join("—" if site[k] is None else f"{site[k]:.1f}" for k in ("up_mbps", "down_mbps"))
        sent.append(f" · syncer's site{' ' + site['name'] if site['name'] else ''}: {link} Mbit/s out / in")
    books = _line(
        f"tokens trained {_short(tokens.get('trained'))} of {_short(tokens.get('budget'))}",
        f" · merged {_short(tokens.get('merged'))} · late {_short(tokens.get('late_merged'))}",
        f" · dropped {_short(tokens.get('dropped'))} · pending {_short(tokens.get('pending'))} · ",
    )
    if ledger:
        books.append("balanced" if ledger.get("balanced") else "UNBALANCED", style="green" if ledger.get("balanced") else "red")
    return [*finished_lines(s), first, rounds, sent, books, *shard_lines(s), *relay_lines(s), *trust_lines(s)]


def relay_lines(s: dict[str, Any]) -> list[Text]:
    """The regions' relays in one line: each pulls its region's versions from the synchronizer once."""
    feeds = s.get("relays") or {}
    if not feeds:
        return []
    line = _line(("relays ", "dim"))
    for region, feed in feeds.items():
        if feed["streams"]:
            serving = feed.get("learners")
            for_whom = f" for {serving} learner{'s' * (serving != 1)}" if serving is not None else ""
            line.append(f"{region}: {sized(feed['bytes'])} pulled{for_whom} · ")
        else:
            ago = _num(feed["seen_s_ago"], 0, " s")
            line.append(f"{region}: down for {ago} (its learners pull from the shards) · ", style="yellow")
    return [line]


def shard_lines(s: dict[str, Any]) -> list[Text]:
    """A sharded synchronizer's shards, one line each: where, which fragments at which versions, its books, its site."""
    lines = []
    for row in s.get("shards") or []:
        if not row["reachable"]:
            lines.append(_line((f"shard at {row['url']}: not answering ({row['error']})", "bold red")))
            continue
        site = row["site"]
        link = " / ".join("—" if site[k] is None else f"{site[k]:.1f}" for k in ("up_mbps", "down_mbps"))
        owned = " ".join(f"f{p}v{row['versions'][p]}" for p in row["owned"] or [])
        line = _line((f"{row['shard']} ", "bold"), f"{site['name'] or '-'} · {owned} · rounds {row['rounds']} · ")
        line.append("balanced" if row["balanced"] else "UNBALANCED", style="green" if row["balanced"] else "red")
        line.append(f" · {row['phase']} · site {link} Mbit/s out / in")
        lines.append(line)
    if look := s.get("replanner"):
        lines.append(_line(("re-planner ", "bold"), replanner_text(look)))
    return lines


def replanner_text(look: dict[str, Any]) -> str:
    """The re-planner's last look: the busiest site's predicted utilisation now and with the best placement (and,
    while the busiest site is under the re-planner's floor, that nothing moves: else a large gain unacted on reads as
    a stuck re-planner)."""
    if look.get("error"):
        return f"could not look ({str(look['error'])[:120]}); {look.get('replans', 0)} re-plan(s) so far"
    if look.get("skipped"):
        return f"not deciding ({str(look['skipped'])[:120]}); {look.get('replans', 0)} re-plan(s) so far"
    busiest, floor = look.get("utilisation"), look.get("floor")
    idle = _figure(busiest) and _figure(floor) and busiest < floor
    return (
        f"busiest site {_pct(busiest)} of its link, best placement {_pct(look.get('best'))}"
        f" (seen {look.get('streak') or 0}x{f'; nothing moves under {_pct(floor)}' if idle else ''})"
        f" · {look.get('replans', 0)} re-plan(s)"
    )


def _figure(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def finished_lines(s: dict[str, Any]) -> list[Text]:
    """While finishing, why; once finished, the result in one line: the numbers a user came for and where it is."""
    job = s.get("job") or {}
    if job.get("phase") == "finishing":
        return [_line((f"finishing: {job.get('reason', '')}", "bold yellow"))]
    result = job.get("summary")
    if job.get("phase") != "finished" or not result:
        return []
    tokens = result.get("tokens") or {}
    cost = "" if result.get("dollars") is None else f" · ${result['dollars']:.2f}"
    where = f" · result in {result['result']}" if result.get("result") else ""
    where += f" · model: ddctl pull {s.get('run', '')}" if result.get("checkpoint") else ""
    return [
        _line(
            ("finished", "bold green"),
            f": {result.get('reason', '')} · val bpb {_num(result.get('val_bpb'), 3)}",
            f" · merged {_short(tokens.get('merged'))} of {_short(tokens.get('trained'))} tokens trained",
            f" · goodput {_pct(result.get('goodput'))}{cost}{where}",
        )
    ]


def trust_lines(s: dict[str, Any]) -> list[Text]:
    """One red line while a learner is suspended, tokens were rejected or a fragment is degraded; else none."""
    problems = [f"{name} suspended" for name in s.get("suspended", [])]
    rejected = (s.get("tokens") or {}).get("rejected")
    if rejected:
        problems.append(f"rejected {_short(rejected)} tokens")
    problems += [f"f{d['fragment']} degraded: {d['reason']}" for d in s.get("degraded", [])]
    return [_line(("! " + " · ".join(problems), "bold red"))] if problems else []


def _short(n: Any) -> str:
    if not isinstance(n, int | float):
        return "-"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def event_line(e: dict[str, Any]) -> Text:
    """One event-log row: its time, dimmed, then what it says in its style (``events.said``)."""
    when = time.strftime("%H:%M:%S", time.localtime(e.get("t", 0.0)))
    return _line((f"{when} ", "dim"), said(e))


def render(s: dict[str, Any], width: int = 80, height: int = 24) -> RenderableType:
    """The whole screen for a snapshot, fitted to ``width`` x ``height``."""
    learners = sum(len(r["learners"]) for r in s["regions"])
    # header 1, table head 2, job rule + 4 lines, events rule + at least 3 lines
    room = max(height - 1 - 2 - 5 - 4, 1)
    job = global_lines(s, width)
    room = max(room - (len(job) - 4), 1)
    table = learners_table(s, width, max_rows=min(learners, room) if learners else 1)
    used = 1 + 2 + min(learners, room) + 1 + len(job) + 1
    events = [event_line(e) for e in s["events"][-max(height - used - 1, 3) :]]
    parts: list[RenderableType] = [
        header(s),
        table,
        Rule("job", style="dim", align="left"),
        *job,
        Rule("events", style="dim", align="left"),
        *(events or [Text("(none yet)", style="dim")]),
    ]
    return Group(*parts)

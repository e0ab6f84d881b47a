"""``/metrics``: the syncer's state in the Prometheus text format, through prometheus-client.

A custom collector builds every family from one consistent view of the runtime
(taken on the core thread, like ``status``), so the numbers agree with the
status page; prometheus-client writes the exposition format and escapes labels.
Non-finite samples are left out: a scrape never carries NaN or Inf.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ddctl_agents.core.shard_syncer import ShardSynchronizer
from ddctl_agents.service.observability import learner_mfu

if TYPE_CHECKING:
    from ddctl_agents.service.runtime import SyncerRuntime

Samples = Iterable[tuple[dict[str, str], float | int | None]]


def metrics(rt: SyncerRuntime) -> str:
    """Prometheus text exposition format (0.0.4) of ``rt`` now."""
    families = list(_families(rt))

    class _Snapshot:
        def collect(self) -> Iterator[Metric]:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot())
    return generate_latest(registry).decode()


def _family(kind: str, name: str, help_text: str, samples: Samples) -> Metric:
    rows = [(labels, value) for labels, value in samples if value is not None and math.isfinite(value)]
    names = sorted({k for labels, _ in rows for k in labels})
    family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(f"ddctl_{name}", help_text, labels=names)
    for labels, value in rows:
        family.add_metric([labels.get(k, "") for k in names], float(value))
    return family


def _families(rt: SyncerRuntime) -> Iterator[Metric]:
    s = rt.syncer
    yield _family("counter", "rounds", "Rounds merged since the job started.", [({}, s.rounds_closed)])
    yield _family(
        "gauge",
        "fragment_version",
        "Current version of each fragment.",
        [({"fragment": str(p)}, v) for p, v in enumerate(s.versions)],
    )
    yield _family("gauge", "learners_live", "Learners currently counted toward quorum.", [({}, len(s.live))])
    cadences = [({"learner": m}, k) for m, k in sorted(s.cadence.items())]
    yield _family(
        "gauge", "learner_cadence", "Periods of H steps between a learner's sends of a fragment, as it registered.", cadences
    )
    ledger = [({"bucket": k}, v) for k, v in s.ledger.as_dict().items()]
    yield _family("gauge", "ledger_fragment_tokens", "Token ledger in fragment-tokens, by bucket.", ledger)
    degraded = rt.degraded()
    faults = [({"fragment": str(p)}, n) for p, n in enumerate(s.faults)]
    yield _family("counter", "fragment_faults", "Unexpected errors in a fragment's rounds.", faults)
    marks = [({"fragment": str(p)}, int(p in degraded)) for p in range(s.fragmentation.count)]
    yield _family("gauge", "fragment_degraded", "1 while a fragment's last round failed or its version could not be sent.", marks)
    standings = sorted(s.quarantine.standings.items())
    rejected = [({"learner": m}, st.rejections) for m, st in standings]
    yield _family("counter", "learner_rejections", "Updates refused for their content, per learner, since admitted.", rejected)
    suspended = [({"learner": m}, int(st.suspended is not None)) for m, st in standings]
    yield _family("gauge", "learner_suspended", "1 while a learner is suspended until an operator readmits it.", suspended)
    failures = [({"task": name}, n) for name, n in sorted(rt.task_failures.items())]
    yield _family("counter", "task_failures", "Failures of the service's long-lived tasks (each was restarted).", failures)
    rates, rtts = [], []
    for name, links in sorted(s.links.items()):
        region = rt.roster.region_of(name)
        for direction, link in (("up", links.up), ("down", links.down)):
            rates.append(({"learner": name, "region": region, "direction": direction}, link.bytes_per_s))
        rtts.append(({"learner": name, "region": region}, links.up.rtt_s))
    yield from _learner_families(rt)
    yield from _relay_families(rt)
    yield _family("gauge", "link_bytes_per_second", "Throughput measured by the sending side's kernel (TCP counters).", rates)
    yield _family("gauge", "link_rtt_seconds", "EWMA round-trip time reported by learners.", rtts)
    regional = [
        ({"region": name, "direction": d}, link.bytes_per_s)
        for name, links in sorted(rt.roster.regions.items())
        for d, link in (("up", links.up), ("down", links.down))
    ]
    yield _family("gauge", "region_bytes_per_second", "Throughput per region, measured as per learner.", regional)
    site = rt.roster.site_links
    site.read(rt.clock())
    own = [({"site": rt.roster.site, "direction": d}, m.bytes_per_s) for d, m in (("up", site.up), ("down", site.down))]
    yield _family("gauge", "site_bytes_per_second", "This service's site link, all its transfers across it at once.", own)
    yield _family("counter", "bytes_received", "Update bytes accepted.", [({}, rt.bytes_up)])
    yield _family("counter", "bytes_sent", "Fragment bytes streamed to learners.", [({}, rt.bytes_down)])
    refused = [({"code": str(k)}, v) for k, v in sorted(rt.rejections.items())]
    yield _family("counter", "http_rejections", "Requests refused, by status.", refused)
    yield _family("counter", "snapshots", "Durable snapshots written.", [({}, rt.snapshots["taken"])])
    if rt.val_bpb:
        yield _family("gauge", "val_bpb", "Validation bits per byte of the global model.", [({}, rt.val_bpb[-1][2])])
    if isinstance(s, ShardSynchronizer):
        yield from _shard_families(rt, s)


def _shard_families(rt: SyncerRuntime, s: ShardSynchronizer) -> Iterator[Metric]:
    """A shard's place: its map's epoch, what it owns, the fragments it moved and the checkpoint cuts it took."""
    shard = {"shard": s.role.name}
    yield _family("gauge", "shard_map_epoch", "Epoch of the shard map this shard serves.", [(shard, s.role.map.epoch)])
    yield _family("gauge", "fragments_owned", "Fragments this shard owns now.", [(shard, len(s.role.owned))])
    moves = [({**shard, "direction": d}, n) for d, n in sorted(s.moves.items())]
    yield _family("counter", "handoffs", "Fragments handed out to or taken in from other shards.", moves)
    cuts = [({**shard, "trigger": t}, n) for t, n in sorted(rt.cuts.taken.items())]
    yield _family("counter", "checkpoint_cuts", "Global-checkpoint cuts taken, by what triggered them.", cuts)


def _relay_families(rt: SyncerRuntime) -> Iterator[Metric]:
    """Each region's relay as ``/v1/status`` shows it (``relay_feeds``), and the live learners it serves now."""
    now, feeds = rt.clock(), rt.streams
    rows = [({"region": region}, feed) for region, feed in sorted(feeds.feeds.items())]
    yield _family(
        "gauge",
        "relay_streams",
        "Streams a region's relay has open here now (0 once it has gone).",
        [(r, f.streams) for r, f in rows],
    )
    yield _family("counter", "relay_bytes_sent", "Fragment bytes streamed to a region's relay.", [(r, f.bytes) for r, f in rows])
    seen = [(r, max(now - f.last_seen, 0.0)) for r, f in rows]
    yield _family("gauge", "relay_seen_seconds", "Seconds since a region's relay was last sent a record or keep-alive.", seen)
    served = [(r, feeds.serving(r["region"], rt.roster.info, rt.syncer.live)) for r, _ in rows]
    yield _family("gauge", "relay_learners", "Live learners of a region reading its relay rather than a stream here.", served)


def _learner_families(rt: SyncerRuntime) -> Iterator[Metric]:
    """Throughput, devices and MFU of live learners only: a departed learner's last rate would read as current."""
    live = [(name, rt.roster.info[name]) for name in sorted(rt.syncer.live) if name in rt.roster.info]
    rates, devices, mfus, in_flight = [], [], [], []
    for name, info in live:
        labels = {"learner": name, "region": info.region}
        rates.append((labels, info.tokens_per_s))
        devices.append(({**labels, "accelerator": info.accelerator}, info.devices))
        mfus.append((labels, learner_mfu(rt, info)))
        in_flight.append((labels, info.uploads_in_flight or None))
    yield _family("gauge", "learner_tokens_per_second", "Tokens per second a learner trains, all its ranks together.", rates)
    yield _family("gauge", "learner_devices", "Ranks a learner trains on, labelled with its accelerator.", devices)
    yield _family("gauge", "learner_mfu", "Model FLOPs utilisation of a learner's devices (where their peak is known).", mfus)
    yield _family("gauge", "learner_uploads_in_flight", "Uploads a learner keeps in flight (its pacer's cap).", in_flight)

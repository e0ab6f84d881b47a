"""Rich tables for benchmark results: pure functions from result dicts to renderables."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def codec_table(result: dict[str, Any]) -> Table:
    memcpy = result["memcpy_gbps"]
    table = Table(title=f"codecs on one core (memcpy {memcpy:.2f} GB/s, native={result.get('native')})")
    for col in ("codec", "encode GB/s", "x memcpy", "decode GB/s", "x memcpy", "rel L2 error"):
        table.add_column(col, justify="right")
    for name, row in result["codecs"].items():
        table.add_row(
            name,
            f"{row['encode_gbps']:.2f}",
            f"{row['encode_gbps'] / memcpy:.2f}",
            f"{row['decode_gbps']:.2f}",
            f"{row['decode_gbps'] / memcpy:.2f}",
            f"{row['rel_error']:.4f}",
        )
    return table


def quality_table(result: dict[str, Any]) -> Table:
    seeds = result.get("seeds", [0])
    table = Table(
        title=f"quality at {result['tokens']:,} tokens per run" + (f", mean of seeds {seeds}" if len(seeds) > 1 else "")
    )
    for col in ("run", "M", "codec", "merge", "frag", "grace", "val_bpb", "± stdev", "bytes/token", "rounds", "wall s"):
        table.add_column(col, justify="right")
    for name, row in result["runs"].items():
        c = row["config"]
        table.add_row(
            name,
            str(c["learners"]),
            c["codec"] if not name.startswith("dp") else "-",
            c["merge"] if not name.startswith("dp") else "-",
            f"{c['fragmentation']}/{c['fragments']}" if not name.startswith("dp") else "-",
            str(c["grace"]) if not name.startswith("dp") else "-",
            f"{row['val_bpb']:.4f}",
            "-" if row.get("val_bpb_stdev") is None else f"{row['val_bpb_stdev']:.4f}",
            f"{row['bytes_per_token']:.1f}",
            str(row.get("rounds", "-")),
            f"{row['wall_s']:.0f}",
        )
    return table


def transport_table(result: dict[str, Any]) -> Table:
    size = result["payload_bytes"] / 2**20
    table = Table(title=f"one {size:.1f} MiB update to a real syncer ({'TLS' if result['tls'] else 'plain text'})")
    for col in ("protocol", "median Mbit/s", "best Mbit/s", "negotiated"):
        table.add_column(col, justify="right")
    for p in ("h2", "h1"):
        table.add_row(p, f"{result[f'{p}_mbps']:.0f}", f"{result[f'best_{p}_mbps']:.0f}", result["negotiated"][p])
    table.add_row("h2 / h1", f"{result['ratio']:.2f}", f"{result['best_ratio']:.2f}", "")
    return table


def syncer_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"syncer round: {result['learners']} int4 updates of {result['params']:,} params, one core")
    for col in ("path", "merge GB/s", "x memcpy", "round s", "decode s", "admit+merge+step s"):
        table.add_column(col, justify="right")
    reference = result["reference"]
    sums = result.get("int4_sums", "")  # which sums the fused round ran on
    fused = f"{result['path']} ({sums})" if sums and result["path"] == "fused" else result["path"]
    for name, row in ((fused, result), ("reference", reference)):
        table.add_row(
            name,
            f"{row['merge_gbps']:.3f}",
            f"{row['ratio_to_memcpy']:.4f}",
            f"{row['round_seconds']:.3f}",
            f"{row['decode_seconds']:.3f}",
            f"{row['merge_seconds']:.3f}",
        )
    table.caption = f"memcpy {result['memcpy_gbps']:.2f} GB/s; fused {result['fused_speedup']:.2f}x the reference"
    for row in result.get("scaling", {}).get("shards", []):
        table.caption += f"; {row['shards']} shards: {row['aggregate_gbps']:.3f} GB/s ({row['x_one_shard']:.2f}x)"
    return table


def link_table(result: dict[str, Any]) -> Table:
    first = result["runs"][0]
    megabytes, rate = first["frame_bytes"] / 1e6, result["rate_mbit"]
    table = Table(title=f"{result['uploads']} uploads of {megabytes:.1f} MB queued at once, {rate:.0f} Mbit/s link")
    for col in ("in flight", "cap at end", "goodput Mbit/s", "x rate", "x first", "first ack s", "x first", "median ack s",
                "x first", "tracker x rate"):  # fmt: skip
        table.add_column(col, justify="right")
    for run in result["runs"]:
        table.add_row(
            str(run["parallel"]),
            str(run["in_flight_cap"]),
            f"{run['goodput_mbit']:.1f}",
            f"{run['goodput_fraction']:.3f}",
            f"{run['goodput_x_baseline']:.3f}",
            f"{run['first_ack_s']:.2f}",
            f"{run['first_ack_x_baseline']:.3f}",
            f"{run['median_ack_s']:.2f}",
            f"{run['median_ack_x_baseline']:.3f}",
            "-" if run["tracker_fraction"] is None else f"{run['tracker_fraction']:.3f}",
        )
    return table


def learner_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"learner speed: {result['preset']}, batch {result['batch']}, compile={result['compile']}")
    for col in ("ranks", "device", "tokens/s", "MFU", "step s", "with sync", "sync cost", "x 1 rank", "updates"):
        table.add_column(col, justify="right")
    for run in result["runs"]:
        mfu, speedup = run["mfu"], run["speedup_over_one_rank"]
        table.add_row(
            str(run["ranks"]),
            run["accelerator"],
            f"{run['tokens_per_s']:,.0f}",
            "-" if mfu is None else f"{100 * mfu:.1f}%",
            f"{run['step_s_without_sync']:.4f}",
            f"{run['step_s_with_sync']:.4f}",
            f"{100 * run['sync_cost']:+.1f}%",
            "-" if speedup is None else f"{speedup:.2f}",
            str(run["updates"]),
        )
    return table


def checkpoint_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"checkpoint of {result['preset']} ({result['params']:,} params, model + momentum), fsynced")
    for col in ("write s", "torch.save s", "x torch", "read+check s", "torch.load s", "x torch", "MB", "torch MB"):
        table.add_column(col, justify="right")
    table.add_row(
        f"{result['write_s']:.3f}",
        f"{result['torch_save_s']:.3f}",
        f"{result['write_ratio']:.2f}",
        f"{result['read_s']:.3f}",
        f"{result['torch_load_s']:.3f}",
        f"{result['read_ratio']:.2f}",
        f"{result['bytes'] / 1e6:.1f}",
        f"{result['torch_bytes'] / 1e6:.1f}",
    )
    return table


def ladder_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"scale ladder at {result['tokens_per_param']:g} tokens per parameter")
    for col in ("rung", "params", "tokens", "arm", "seeds", "val_bpb", "± stdev", "/ DP", "bytes/token", "DP bytes ÷", "wall s"):
        table.add_column(col, justify="right")
    for rung, r in result["rungs"].items():
        for arm, a in r["arms"].items():
            ratio, traffic = a.get("val_bpb_over_dp"), a.get("dp_bytes_per_token_over_this")
            table.add_row(
                rung, f"{r['params']:,}", f"{r['tokens']:,}", arm, str(a["seeds"]), f"{a['val_bpb']:.4f}",
                "-" if a["val_bpb_stdev"] is None else f"{a['val_bpb_stdev']:.4f}",
                "-" if ratio is None else f"{ratio:.3f}", f"{a['bytes_per_token']:.1f}",
                "-" if traffic is None else f"{traffic:.0f}x", f"{a['wall_s']:.0f}",
            )  # fmt: skip
    return table


def cadence_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"L1 through a {result['rate_mbit']:g} Mbit/s link (L0 unshaped), {result['tokens']:,} tokens, tiny")
    for col in ("L1 cadence", "L1 MB", "x first", "link load", "L1 accepted", "job accepted", "dropped", "val_bpb", "wall s"):
        table.add_column(col, justify="right")
    for row in result["rows"]:
        table.add_row(
            f"every {row['cadence']}H",
            f"{row['l1']['bytes'] / 1e6:.1f}",
            f"{row['x_first']['l1_bytes']:.2f}",
            f"{row['link_load']:.2f}",
            "-" if row["l1_efficiency"] is None else f"{row['l1_efficiency']:.3f}",
            "-" if row["job_efficiency"] is None else f"{row['job_efficiency']:.3f}",
            f"{row['ledger']['dropped']:,}",
            "-" if row["val_bpb"] is None else f"{row['val_bpb']:.3f}",
            f"{row['wall_s']:.0f}",
        )
    return table


def wan_table(result: dict[str, Any]) -> Table:
    case = result["case"]
    links = "/".join(f"{up:g}" for up, _ in case["links_mbit"].values())
    table = Table(title=f"Links {links} Mbit/s, learners {'/'.join(map(str, case['learners'].values()))}, {case['preset']}, "
                  f"{case['fragments']} fragments, H = {case['inner_steps']}, synthetic step {case['step_s']:g} s")  # fmt: skip
    trained = bool(case.get("train_tokens"))
    columns = ("layout", "shards at", "cadence", "in flight", "efficiency", "fresh", "x first", "worst site", "measured",
               "predicted")  # fmt: skip
    for col in (*columns, "val_bpb") if trained else columns:
        table.add_column(col, justify="right")
    for row in result["rows"]:
        worst = max(row["sites"], key=lambda r: row["sites"][r]["measured"])
        site = row["sites"][worst]
        table.add_row(
            row["layout"],
            ",".join(s["site"] for s in row["shards"]),
            "/".join(str(k) for k in row["cadence"].values()),
            str(row["in_flight"]),
            f"{row['efficiency']:.3f}",
            f"{row['fresh']:.3f}" if "fresh" in row else "-",
            "-" if row["x_first"] is None else f"{row['x_first']:.2f}",
            worst,
            f"{site['measured']:.2f}",
            f"{site['predicted_at_pace']:.2f}",
            *([f"{row['val_bpb']:.4f}"] if trained else []),
        )
    return table


def replan_table(result: dict[str, Any]) -> Table:
    case, knobs = result["case"], result["replan"]
    title = f"Shards at {', '.join(result['plan']['shards'])}; re-plan past a {knobs['gain']:.0%} gain seen "
    title += f"{knobs['confirmations']} times, {knobs['dwell_s']:g} s apart; {case['seconds']:g} s per scenario"
    table = Table(title=title)
    for col in ("scenario", "link changes", "looks", "re-plans", "moves", "peak gain seen", "efficiency", "balanced"):
        table.add_column(col, justify="right")

    def shown(m: dict[str, Any]) -> str:
        return f"{m['fragment']} {m['from']}->{m['to']}" + (" (broken)" if "error" in m else "")

    for row in result["rows"]:
        moves = "; ".join(f"{r['t']:.0f}s: " + ", ".join(map(shown, r["moves"])) for r in row["replans"])
        peak = row["peak_gain_seen"]
        table.add_row(row["scenario"], str(len(row["changes"])), str(row["looks"]), str(len(row["replans"])), moves or "-",
                      "-" if peak is None else f"{peak:.0%}", f"{row['efficiency']:.3f}", str(row["balanced"]))  # fmt: skip
    return table

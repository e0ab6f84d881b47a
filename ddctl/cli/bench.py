"""``ddctl bench``: benchmarks that measure against their baseline in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, stdout
from ddctl.errors import DdctlError

app = typer.Typer(help="Benchmarks; each reports ratios against a baseline measured in the same run.", no_args_is_help=True)


def comma_ints(text: str, option: str, low: int, high: int) -> list[int]:
    """``1,2,4`` as integers, each in [low, high]; anything else is refused naming the option."""
    try:
        parsed = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        parsed = []
    if not parsed or any(not low <= n <= high for n in parsed):
        raise DdctlError(f"{option} must be comma-separated integers in [{low}, {high}], got {text!r}")
    return parsed


@app.command("codec")
def codec(
    numel: Annotated[int, typer.Option(min=1024, max=2**30, help="Values in the test buffer.")] = 16 * 2**20,
    repeats: Annotated[int, typer.Option(help="Timed repetitions; the best is kept.")] = 5,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Encode/decode GB/s of each codec on one core, beside a memcpy of the same buffer."""
    from ddctl.bench.codec import measure_codecs
    from ddctl.bench.report import codec_table

    result = run_guarded(lambda: measure_codecs(numel=numel, repeats=repeats))
    if json_out:
        print_json(result)
    else:
        stdout().print(codec_table(result))


@app.command("quality")
def quality(
    tokens: Annotated[int, typer.Option(help="Token budget of every run (equal across runs).")] = 1_000_000,
    only: Annotated[str, typer.Option(help="Comma-separated run names to run (default: all).")] = "",
    jobs: Annotated[int, typer.Option(help="Runs in parallel (each uses one core).")] = 1,
    preset: Annotated[str | None, typer.Option(help="Model preset of every run [default: the job's, tiny].")] = None,
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds; val_bpb is their mean, with the spread.")] = "0",
    out: Annotated[Path | None, typer.Option(help="Also write the JSON result here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """val_bpb and bytes/token of Decoupled variants against data-parallel, at equal tokens."""
    from ddctl.bench.quality import run_quality
    from ddctl.bench.report import quality_table

    result = run_guarded(
        lambda: run_quality(
            tokens=tokens,
            only=[s for s in only.split(",") if s],
            out=out,
            jobs=jobs,
            preset=preset,
            seeds=comma_ints(seeds, "--seeds", 0, 2**31 - 1),
        )
    )
    if json_out:
        print_json(result)
    else:
        stdout().print(quality_table(result))
    for run, reason in result.get("failed", {}).items():
        typer.echo(f"ddctl: run {run} failed: {reason}", err=True)
    if result.get("failed"):
        raise typer.Exit(1)


@app.command("ladder")
def ladder(
    rungs: Annotated[
        str, typer.Option(help="Comma-separated rungs (presets), smallest first: micro, mini, tiny.")
    ] = "micro,mini",
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds; each rung and arm runs once per seed.")] = "0",
    arms: Annotated[
        str, typer.Option(help="Comma-separated arms: dp_m4, decoupled_m2, decoupled_m4, decoupled_m8 (default: all).")
    ] = "",
    tokens_per_param: Annotated[float, typer.Option(help="Token budget of a rung per model parameter.")] = 20.0,
    jobs: Annotated[int, typer.Option(help="Runs in parallel (each uses one core).")] = 1,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON result here, after every run.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Decoupled M=2/4/8 against data-parallel M=4 at ~20 tokens per parameter, rung by rung (hours: run outside CI)."""
    from ddctl.bench.ladder import ARMS, run_ladder
    from ddctl.bench.report import ladder_table

    result = run_guarded(
        lambda: run_ladder(
            rungs=[r for r in rungs.split(",") if r],
            seeds=comma_ints(seeds, "--seeds", 0, 2**31 - 1),
            arms=[a for a in arms.split(",") if a] or list(ARMS),
            tokens_per_param=tokens_per_param,
            jobs=jobs,
            out=out,
        )
    )
    if json_out:
        print_json(result)
    else:
        stdout().print(ladder_table(result))


@app.command("transport")
def transport(
    repeats: Annotated[int, typer.Option(help="Timed uploads per protocol (after one warm-up each); medians reported.")] = 5,
    preset: Annotated[str, typer.Option(help="Model preset whose fragment is uploaded (base: ~64 MiB in fp32).")] = "base",
    fragments: Annotated[int, typer.Option(help="Fragments the model is split into.")] = 8,
    tls: Annotated[
        bool, typer.Option(help="TLS with the job's CA (ALPN h2 vs http/1.1); --no-tls compares h2c with HTTP/1.1.")
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Upload one large update to a real syncer over HTTP/2 and HTTP/1.1 in the same run."""
    from ddctl.bench.report import transport_table
    from ddctl.bench.transport import measure_transport

    result = run_guarded(lambda: measure_transport(repeats=repeats, preset=preset, fragments=fragments, tls=tls))
    if json_out:
        print_json(result)
    else:
        stdout().print(transport_table(result))


@app.command("syncer")
def syncer(
    learners: Annotated[int, typer.Option(help="M: updates merged per round.")] = 8,
    params: Annotated[int, typer.Option(help="Parameters in the merged fragment.")] = 8 * 2**20,
    repeats: Annotated[int, typer.Option(help="Timed rounds (after one warm-up); the best is kept.")] = 7,
    shards: Annotated[
        int, typer.Option(min=1, help="Also run 1..N syncer processes at once, each on its own fragment (aggregate GB/s).")
    ] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Merge throughput of the syncer (decode + weights + RDA + Nesterov) on one core, fused and reference, beside memcpy."""
    from ddctl.bench.report import syncer_table
    from ddctl.bench.rounds import measure_shard_scaling, measure_syncer

    def measure() -> dict[str, object]:
        result = measure_syncer(learners=learners, numel=params, repeats=repeats)
        if shards > 1:
            result["scaling"] = measure_shard_scaling(shards, learners=learners, numel=params, rounds=repeats + 1)
        return result

    result = run_guarded(measure)
    if json_out:
        print_json(result)
    else:
        stdout().print(syncer_table(result))


@app.command("checkpoint")
def checkpoint(
    preset: Annotated[
        str, typer.Option(help="The model whose parameters are checkpointed (tiny, small, base, large).")
    ] = "small",
    repeats: Annotated[int, typer.Option(help="Timed repetitions; the best is kept.")] = 3,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Seconds to write and to read back (checked) a checkpoint, beside torch.save and torch.load of the same tensors."""
    from ddctl.bench.checkpoint import measure_checkpoint
    from ddctl.bench.report import checkpoint_table

    result = run_guarded(lambda: measure_checkpoint(preset=preset, repeats=repeats))
    if json_out:
        print_json(result)
    else:
        stdout().print(checkpoint_table(result))


@app.command("link")
def link(
    rate: Annotated[float, typer.Option(help="Uplink rate the tbf qdisc allows, Mbit/s.")] = 80.0,
    uploads: Annotated[int, typer.Option(help="Updates pushed after one warm-up.")] = 8,
    parallel: Annotated[
        list[str] | None,
        typer.Option(help="Uploads in flight: N or auto (the learner's default); repeat to compare, against the first."),
    ] = None,
    preset: Annotated[str, typer.Option(help="Model preset of the update (small: ~6 MB in int4).")] = "small",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Goodput of int4 uploads through a tc-tbf-shaped link in a network namespace (needs root)."""
    from ddctl.bench.link import compare_in_flight
    from ddctl.bench.report import link_table
    from ddctl.bench.wan_layouts import in_flight_setting

    arms = parallel or ["auto"]
    result = run_guarded(lambda: compare_in_flight(rate, uploads, preset, [in_flight_setting(a, "--parallel") for a in arms]))
    if json_out:
        print_json(result)
    else:
        stdout().print(link_table(result))


@app.command("cadence")
def cadence(
    rate: Annotated[float, typer.Option(help="L1's link, Mbit/s each way (tc tbf).")] = 4.0,
    cadences: Annotated[str, typer.Option(help="L1's cadences to compare, e.g. 1,2,4 (L0 sends every period).")] = "1,2,4",
    tokens: Annotated[int, typer.Option(help="Each row's training budget, both learners together.")] = 300_000,
    parallel: Annotated[int, typer.Option(help="L1's uploads in flight at once, fixed (the learner's own default is auto).")] = 3,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """A learner on a slow shaped link sending every period against every k-th: traffic, accepted work, val_bpb
    (real processes; needs root)."""
    from ddctl.bench.cadence import measure_cadence
    from ddctl.bench.report import cadence_table

    result = run_guarded(lambda: measure_cadence(rate, comma_ints(cadences, "--cadences", 1, 8), tokens, parallel))
    if json_out:
        print_json(result)
    else:
        stdout().print(cadence_table(result))


@app.command("wan")
def wan(
    layouts: Annotated[
        str,
        typer.Option(
            help="Layouts to run, in order: N, N-rr, P2, W, or W-direct (W planned without relays); the first is the others' "
            "x. Each may end @K (every region at cadence K: W@1 is W with no region slowed down), +staleness or +period (how "
            "late updates are weighed) and /N or /auto (uploads in flight), in that order."
        ),
    ] = ("N,N-rr,P2,W"),
    fast_mbit: Annotated[float, typer.Option(help="The fast sites' links, Mbit/s each way (the rest 1/5 and 1/20).")] = 10.0,
    step: Annotated[float, typer.Option(help="Seconds per synthetic inner step of every learner.")] = 0.1,
    seconds: Annotated[float, typer.Option(help="How long the learners train in each layout.")] = 60.0,
    inner_steps: Annotated[int, typer.Option(help="H: inner steps per outer period (the links' load falls as it grows).")] = 8,
    train: Annotated[int, typer.Option(help="Train for real, this many tokens in all, and report val_bpb (0: synthetic).")] = 0,
    preset: Annotated[str, typer.Option(help="Model preset (micro for synthetic steps; tiny to train).")] = "micro",
    max_behind: Annotated[
        int,
        typer.Option(
            help="Rounds an update may lag beyond its cadence and still merge (late); 0 drops late ones. 1 here, where "
            "the tables in docs/benchmarks.md were taken; a job's default is 0."
        ),
    ] = 1,
    hubs: Annotated[
        float,
        typer.Option(
            help="Add three synchronizer-only hub regions whose links are this share of the fast sites' (0.05-1), and run "
            "the synchronizers there: where one synchronizer's site is the bottleneck. 0: the five regions alone."
        ),
    ] = 0.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """One synchronizer against shards, cadence and pacing over an emulated 5-region WAN: the learners' work merged
    and each site's link load against the plan (real processes, synthetic steps; needs root)."""
    from ddctl.bench.report import wan_table
    from ddctl.bench.wan import measure_wan
    from ddctl.bench.wan_layouts import FIVE_REGIONS, WanCase, with_hubs
    from ddctl.cli.output import progress_lines

    def run() -> dict[str, object]:
        names = [n.strip() for n in layouts.split(",") if n.strip()]
        regions = with_hubs(hubs) if hubs else FIVE_REGIONS
        case = WanCase(fast_mbit=fast_mbit, step_s=step, seconds=seconds, inner_steps=inner_steps, train_tokens=train,
                       preset=preset, max_behind=max_behind, regions=regions)  # fmt: skip
        with progress_lines("ddctl bench wan") as say:
            return measure_wan(case, names, say)

    result = run_guarded(run)
    if json_out:
        print_json(result)
    else:
        stdout().print(wan_table(result))


@app.command("replan")
def replan(
    scenarios: Annotated[
        str,
        typer.Option(
            help="Scenarios, in order: halve (h1's link halved), noise (every link +-20%), kill (halve, and kill -9 of "
            "the shard a move goes to, mid-handoff)."
        ),
    ] = "halve,noise,kill",
    seconds: Annotated[float, typer.Option(help="How long the learners train in each scenario.")] = 120.0,
    every: Annotated[float, typer.Option(help="Seconds between the re-planner's looks at the shards.", min=0.5, max=60)] = 2.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """The running re-planner over an emulated WAN whose shards sit in two hub regions: a halved link should cause one
    re-plan, links jittered by +-20% none, a handoff broken by kill -9 be finished (real processes, synthetic steps;
    needs root)."""
    from ddctl.bench.report import replan_table
    from ddctl.bench.wan_replan import hub_case, measure_replan
    from ddctl.cli.output import progress_lines

    def run() -> dict[str, object]:
        names = [n.strip() for n in scenarios.split(",") if n.strip()]
        with progress_lines("ddctl bench replan") as say:
            return measure_replan(hub_case(seconds=seconds), names, every_s=every, say=say)

    result = run_guarded(run)
    if json_out:
        print_json(result)
    else:
        stdout().print(replan_table(result))


@app.command("learner")
def learner(
    preset: Annotated[str, typer.Option(help="Model preset to train (base: ~128M, for a GPU).")] = "tiny",
    ranks: Annotated[str, typer.Option(help="Comma-separated rank counts to measure, e.g. 1,8 (torchrun beyond one).")] = "1",
    device: Annotated[str, typer.Option(help="Where to train: auto, cuda or cpu.")] = "auto",
    batch: Annotated[int, typer.Option(help="Sequences per learner step, split over the ranks.")] = 8,
    steps: Annotated[int, typer.Option(help="Steps per timed block.")] = 16,
    blocks: Annotated[int, typer.Option(help="Timed blocks with and without sync, alternating; the fastest of each counts.")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed steps first (compilation and allocator settle there).")] = 5,
    compile: Annotated[bool, typer.Option("--compile", help="Compile the model with torch.compile first.")] = False,
    shard: Annotated[bool, typer.Option("--shard", help="FSDP2 across the ranks instead of DDP.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Tokens/s and MFU of a preset on this device, and step time with outer sync against without it."""
    import subprocess

    from ddctl.bench.report import learner_table
    from ddctl.errors import WorkerError
    from ddctl_agents.train.speed import measure

    def counts() -> list[int]:
        parsed = comma_ints(ranks, "--ranks", 1, 64)
        if min(steps, blocks) < 1 or warmup < 0:
            raise DdctlError(f"--steps and --blocks must be >= 1 and --warmup >= 0, got {steps}, {blocks} and {warmup}")
        if any(batch % r for r in parsed):
            raise DdctlError(f"--batch {batch} must split evenly over every rank count in {ranks!r}")
        return parsed

    def run() -> dict[str, object]:
        try:
            return measure(preset, counts(), device, batch, steps, blocks, warmup, compile, shard)
        except subprocess.CalledProcessError as exc:
            raise WorkerError(f"a learner rank failed with exit code {exc.returncode}; its output is above") from None

    result = run_guarded(run)
    if json_out:
        print_json(result)
    else:
        stdout().print(learner_table(result))

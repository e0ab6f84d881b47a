"""``ddctl bench``: benchmarks that measure against their baseline in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, stdout

app = typer.Typer(help="Benchmarks; each reports ratios against a baseline measured in the same run.", no_args_is_help=True)


@app.command("codec")
def codec(
    numel: Annotated[int, typer.Option(help="Values in the test buffer.")] = 16 * 2**20,
    repeats: Annotated[int, typer.Option(help="Timed repetitions; the best is kept.")] = 5,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Encode/decode GB/s of each codec on one core, beside a memcpy of the same buffer."""
    from ddctl.bench_codec import measure_codecs
    from ddctl.bench_report import codec_table

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
    out: Annotated[Path | None, typer.Option(help="Also write the JSON result here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """val_bpb and bytes/token of Decoupled variants against data-parallel, at equal tokens."""
    from ddctl.bench_quality import run_quality
    from ddctl.bench_report import quality_table

    result = run_guarded(lambda: run_quality(tokens=tokens, only=[s for s in only.split(",") if s], out=out, jobs=jobs))
    if json_out:
        print_json(result)
    else:
        stdout().print(quality_table(result))

"""``ddctl pull``: a run's trained model, from its newest (or a chosen) checkpoint, into a directory here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json
from ddctl.cli.selection import JsonOption, RunOption


def pull(
    run: Annotated[str, typer.Argument(help="The run (default: the only live one; `ddctl ls` lists them).")] = "",
    run_option: RunOption = "",
    out: Annotated[
        Path, typer.Option("--out", help="A new directory for model.safetensors, outer.safetensors, manifest.json, config.json.")
    ] = Path("model"),
    checkpoint: Annotated[str, typer.Option("--checkpoint", help="Which one, e.g. ckpt-000003 (default: the newest).")] = "",
    source: Annotated[
        str,
        typer.Option("--from", help="A checkpoint or a checkpoints folder: DIR, s3://B/P or gs://B/P (default: the run's)."),
    ] = "",
    hf: Annotated[bool, typer.Option("--hf", help="Also write OUT/hf, a directory Hugging Face transformers loads.")] = False,
    list_only: Annotated[bool, typer.Option("--list", help="List the checkpoints there are; pull nothing.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Fetch a run's trained model: every file checked against its manifest, then written whole (or not at all)."""
    from ddctl.control import pull as pulling
    from ddctl.control.rundir import RunDir
    from ddctl.control.runs import choose_run
    from ddctl.control.state import State

    def body() -> dict[str, Any]:
        if source:
            where = pulling.open_source(source)
            name = ""
        else:
            with State() as state:
                name = choose_run(state, run or run_option)
                where = pulling.run_source(name, state)
        if list_only:
            return {"run": name, "from": where.label, "checkpoints": pulling.listing(where)}
        found, files, chosen = pulling.fetch(where, checkpoint)
        job = RunDir(name).job if name else None  # a model of yours: its source comes along
        written = pulling.write_out(out, found, files, hf=hf, source_of=job)
        m = found.manifest
        return {"run": m.run, "from": where.label, "checkpoint": chosen, "rounds": m.rounds, "versions": m.versions,
                "merged": m.tokens.get("merged", 0), "val_bpb": m.val_bpb, "out": str(out), "files": written}  # fmt: skip

    result = run_guarded(body)
    if json_out:
        print_json(result)
    elif list_only:
        for entry in result["checkpoints"]:
            typer.echo(
                f"{entry['name'] or '.'}  rounds {entry['rounds']}  merged {entry['merged']:,}  val_bpb {entry['val_bpb']}"
            )
    else:
        typer.echo(
            f"pulled {result['checkpoint']} of run {result['run']} (round {result['rounds']}, "
            f"{result['merged']:,} tokens merged, val_bpb {result['val_bpb']}) into {result['out']}: {', '.join(result['files'])}"
        )

"""``ddctl data``: turn your text into the token shards a job trains on (``DataConfig.token_paths``).

``ddctl data prepare --tokenizer tokenizer.json --out shards/ corpus/`` tokenises every text file
under the inputs with a local ``tokenizers`` file (no download) into the flat uint16/uint32 shards
with JSON sidecars described in ``ddctl_agents.train.tokens``. Files are read in sorted order and
their tokens concatenated, as the byte corpus concatenates their bytes. The shards appear only when
all is written: they are written into a hidden folder beside ``--out``, which is renamed at the end
and removed on any error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ddctl.cli.errors import run_guarded
from ddctl.cli.output import print_json, print_table, progress_bar
from ddctl.errors import DdctlError

if TYPE_CHECKING:
    from ddctl_agents.train.tokens import ShardWriter

app = typer.Typer(help="Prepare your data: text into token shards.", no_args_is_help=True)

CHUNK_BYTES = 1 << 20
"""Text is tokenised in pieces of about this many bytes, cut after a newline."""
BATCH_CHUNKS = 16
"""Pieces handed to the tokenizer at once (it encodes a batch on all cores)."""


def _tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise DdctlError(f"tokenizer file {path} {what}; give a tokenizers JSON file (tokenizer.json)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises a bare Exception for a bad file
        raise DdctlError(f"cannot load {path} as a tokenizers JSON file (tokenizer.json): {exc}") from None


def _text_files(inputs: list[Path]) -> list[Path]:
    """Each input file, and every file under each input folder (sorted, hidden names skipped); each once."""
    files: list[Path] = []
    seen: set[Path] = set()
    for given in inputs:
        if given.is_file():
            found = [given]
        elif given.is_dir():
            found = []
            for folder, dirs, names in os.walk(given):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [Path(folder, n) for n in sorted(names) if not n.startswith(".")]
            found.sort()
        else:
            what = "is neither a file nor a folder" if given.exists() else "does not exist"  # /dev/null, a socket
            raise DdctlError(f"input {given} {what}; give text files or folders of them")
        for path in found:
            if path.resolve() not in seen:
                seen.add(path.resolve())
                files.append(path)
    if not files:
        raise DdctlError(f"no text files in {', '.join(map(str, inputs))}; give text files or folders of them")
    return files


def _pieces(path: Path) -> Iterator[bytes]:
    """The file's bytes in pieces of about CHUNK_BYTES, each ending after a newline (or at the end)."""
    with path.open("rb") as file:
        lines: list[bytes] = []
        size = 0
        for line in file:
            lines.append(line)
            size += len(line)
            if size >= CHUNK_BYTES:
                yield b"".join(lines)
                lines, size = [], 0
        if lines:
            yield b"".join(lines)


def _tokenise(path: Path, tokenizer: Any, writer: ShardWriter, advance: Any) -> None:
    """Append one file's tokens; advance(n) after each n bytes."""
    batch: list[bytes] = []
    offset = 0
    try:
        for piece in _pieces(path):
            batch.append(piece)
            if len(batch) == BATCH_CHUNKS:
                offset = _encode(path, offset, batch, tokenizer, writer, advance)
                batch = []
        _encode(path, offset, batch, tokenizer, writer, advance)
    except OSError as exc:
        raise DdctlError(f"cannot read input {path}: {exc.strerror or exc}") from None


def _encode(path: Path, offset: int, batch: list[bytes], tokenizer: Any, writer: ShardWriter, advance: Any) -> int:
    texts = []
    for piece in batch:
        try:
            texts.append(piece.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DdctlError(f"cannot read input {path}: not UTF-8 text (byte {offset + exc.start}); give text files") from None
        offset += len(piece)
    for piece, encoding in zip(batch, tokenizer.encode_batch(texts, add_special_tokens=False), strict=True):
        writer.add(encoding.ids, text_bytes=len(piece))
        advance(len(piece))
    return offset


def _new_folder(out: Path) -> Path:
    """A hidden folder beside ``out`` (same file system, so the final rename is atomic)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DdctlError(f"--out {out} exists and is not an empty folder; give a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))


def prepare_tokens(inputs: list[Path], tokenizer_file: Path, out: Path, shard_tokens: int) -> dict[str, Any]:
    """Tokenise the inputs into shards in ``out``; a summary of what was written."""
    from ddctl_agents.train.tokens import ShardWriter

    started = time.monotonic()
    if shard_tokens < 1:
        raise DdctlError(f"--shard-tokens must be >= 1, got {shard_tokens}")
    tokenizer = _tokenizer(tokenizer_file)
    files = _text_files(inputs)
    total = sum(f.stat().st_size for f in files)
    staging = _new_folder(out)
    try:
        writer = ShardWriter(staging, vocab_size=tokenizer.get_vocab_size(with_added_tokens=True), shard_tokens=shard_tokens)
        with progress_bar("tokenising", total) as update:
            done = 0

            def advance(n: int) -> None:
                nonlocal done
                done += n
                update(done, total)

            for path in files:
                _tokenise(path, tokenizer, writer, advance)
        shards = writer.close()
        if not shards:
            raise DdctlError(f"no tokens: the {len(files)} input files hold no text the tokenizer turns into tokens")
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "out": str(out),
        "files": len(files),
        "tokens": sum(s.count for s in shards),
        "text_bytes": sum(s.text_bytes or 0 for s in shards),
        "shards": len(shards),
        "vocab_size": writer.vocab_size,
        "dtype": writer.dtype,
        "seconds": round(time.monotonic() - started, 3),
    }


@app.command("prepare")
def prepare(
    inputs: Annotated[list[Path], typer.Argument(help="Text files or folders of them (UTF-8; hidden names skipped).")],
    tokenizer: Annotated[Path, typer.Option(help="A tokenizers JSON file (tokenizer.json); nothing is downloaded.")],
    out: Annotated[Path, typer.Option(help="New folder for the shards and their sidecars.")],
    shard_tokens: Annotated[int, typer.Option(help="Tokens per shard (the last one has fewer).")] = 100_000_000,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Tokenise the text inputs into uint16/uint32 token shards with JSON sidecars, for data.token_paths."""
    result = run_guarded(lambda: prepare_tokens(inputs, tokenizer, out, shard_tokens))
    if json_out:
        print_json(result)
    else:
        print_table(f"ddctl data prepare: {out}", result)

"""``ddctl data prepare``: text through a local tokenizer into token shards that decode back to the text,
with true sidecars, a JSON summary, clear refusals that leave nothing behind, and a job that trains on them."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from typer.testing import CliRunner

from builders import small_run
from ddctl.cli.app import app
from ddctl.cli.data import prepare_tokens
from ddctl.local.training import train_decoupled
from ddctl_agents.errors import ConfigError
from ddctl_agents.train import presets
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.config import DataConfig, ModelConfig
from ddctl_agents.train.data import TokenStream, require_vocab

runner = CliRunner()
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "data",
    "token",
    "shard",
    "learner",
    "region",
    "spot",
    "cloud",
    "model",
]


def prose(seed: int, words: int) -> str:
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, size=12)) + "." for _ in range(words // 12)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here on an in-memory iterator: nothing downloaded."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([prose(seed, 400) for seed in range(5)], trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def write_texts(root: Path) -> str:
    """Three files in a folder (one nested, one hidden and skipped) and what they hold in reading order."""
    files = {
        "corpus/b.txt": prose(1, 600),
        "corpus/a.txt": "héllo wörld ✓ 中文\n" + prose(2, 300),
        "corpus/sub/c.md": prose(3, 200),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "corpus" / ".hidden").write_text("SKIPPED")
    return "".join(files[rel] for rel in ("corpus/a.txt", "corpus/b.txt", "corpus/sub/c.md"))


def prepare(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["data", "prepare", *args])
    return result.exit_code, result.stdout, result.stderr


def test_shards_decode_back_to_the_text_with_true_sidecars(tmp_path: Path, tokenizer_file: Path) -> None:
    text = write_texts(tmp_path)
    out = tmp_path / "shards"
    code, stdout, stderr = prepare(
        "--tokenizer", str(tokenizer_file), "--out", str(out), "--shard-tokens", "500", str(tmp_path / "corpus")
    )
    assert code == 0, stderr
    assert stderr == ""  # not a terminal: no progress bar
    summary = json.loads(stdout) if stdout.startswith("{") else None
    assert summary is None and "tokens" in stdout  # a table without --json
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    bins = sorted(out.glob("*.bin"))
    ids: list[int] = []
    for path in bins:
        meta = json.loads(path.with_suffix(".json").read_text())
        data = path.read_bytes()
        assert meta["dtype"] == "uint16" and meta["vocab_size"] == tokenizer.get_vocab_size() == 320
        assert meta["count"] * 2 == len(data) and meta["sha256"] == hashlib.sha256(data).hexdigest()
        ids += np.frombuffer(data, dtype="<u2").tolist()
    assert [json.loads(p.with_suffix(".json").read_text())["count"] for p in bins[:-1]] == [500] * (len(bins) - 1)
    assert 0 < json.loads(bins[-1].with_suffix(".json").read_text())["count"] <= 500 and len(bins) >= 3
    assert tokenizer.decode(ids) == text
    assert sum(json.loads(p.with_suffix(".json").read_text())["text_bytes"] for p in bins) == len(text.encode())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "shards"]  # no staging folder left


def test_json_summary_says_what_was_written(tmp_path: Path, tokenizer_file: Path) -> None:
    text = write_texts(tmp_path)
    out = tmp_path / "shards"
    args = ["--tokenizer", str(tokenizer_file), "--out", str(out), "--shard-tokens", "700", "--json"]
    code, stdout, _ = prepare(*args, str(tmp_path / "corpus" / "b.txt"), str(tmp_path / "corpus"))  # b.txt once
    assert code == 0
    summary = json.loads(stdout)
    tokens = sum(p.stat().st_size // 2 for p in out.glob("*.bin"))
    assert summary["files"] == 3 and summary["tokens"] == tokens and summary["shards"] == math.ceil(tokens / 700)
    assert summary["vocab_size"] == 320 and summary["dtype"] == "uint16" and summary["seconds"] >= 0
    b = (tmp_path / "corpus" / "b.txt").read_text()
    assert summary["text_bytes"] == len(text.encode()) and text.count(b) == 1


def test_a_vocabulary_over_65536_is_written_as_uint32(tmp_path: Path) -> None:
    vocab = {f"w{i}": i for i in range(70_000)} | {"[UNK]": 70_000}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "words.json"))
    (tmp_path / "t.txt").write_text("w1 w69999 w65536 nope\n")
    code, stdout, _ = prepare(
        "--tokenizer", str(tmp_path / "words.json"), "--out", str(tmp_path / "o"), "--json", str(tmp_path / "t.txt")
    )
    assert code == 0 and json.loads(stdout)["dtype"] == "uint32"
    assert np.fromfile(tmp_path / "o" / "tokens_000000.bin", dtype="<u4").tolist() == [1, 69999, 65536, 70000]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_progress_bar(tmp_path: Path, tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_texts(tmp_path)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    prepare_tokens([tmp_path / "corpus"], tokenizer_file, tmp_path / "out", 1000)
    assert "tokenising" in terminal.getvalue()


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("no-tokenizer", "tokenizer file .*missing.json does not exist; give a tokenizers JSON file"),
        ("bad-tokenizer", "cannot load .*bad.json as a tokenizers JSON file"),
        ("no-input", "input .*absent does not exist; give text files or folders"),
        ("tokenizer-folder", "tokenizer file .*corpus is not a file; give a tokenizers JSON file"),  # said: does not exist
        ("device-input", "input /dev/null is neither a file nor a folder; give text files"),  # said: does not exist
        ("not-utf8", r"cannot read input .*binary.dat: not UTF-8 text \(byte 3\)"),
        ("empty", "no tokens: the 1 input files hold no text"),
        ("out-taken", "--out .*taken exists and is not an empty folder"),
        ("zero-shard", "--shard-tokens must be >= 1, got 0"),
    ],
)
def test_bad_input_exits_2_with_the_reason_and_leaves_nothing(
    tmp_path: Path, tokenizer_file: Path, case: str, reason: str
) -> None:
    write_texts(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "binary.dat").write_bytes(b"abc\xff\xfe\n" * 10)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep").write_text("mine")
    tokenizers = {"no-tokenizer": tmp_path / "missing.json", "bad-tokenizer": tmp_path / "bad.json",
                  "tokenizer-folder": tmp_path / "corpus"}  # fmt: skip
    tokenizer = tokenizers.get(case, tokenizer_file)
    source = {"no-input": tmp_path / "absent", "not-utf8": tmp_path / "binary.dat", "empty": tmp_path / "empty.txt",
              "device-input": Path("/dev/null")}  # fmt: skip
    out = tmp_path / ("taken" if case == "out-taken" else "out")
    before = sorted(p.name for p in tmp_path.iterdir())
    shard_tokens = "0" if case == "zero-shard" else "100"
    code, stdout, stderr = prepare(
        "--tokenizer",
        str(tokenizer),
        "--out",
        str(out),
        "--shard-tokens",
        shard_tokens,
        str(source.get(case, tmp_path / "corpus")),
    )
    assert code == 2 and stdout == ""
    assert stderr.startswith("ddctl: error: ") and stderr.count("\n") == 1
    assert re.search(reason, stderr), stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no shards, no staging folder
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep"]


def test_a_job_trains_on_prepared_shards_and_validates_on_their_held_out_tail(
    tmp_path: Path, tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "".join(prose(seed, 1200) for seed in range(10, 14))
    (tmp_path / "text.txt").write_text(text)
    out = tmp_path / "shards"
    assert prepare("--tokenizer", str(tokenizer_file), "--out", str(out), str(tmp_path / "text.txt"))[0] == 0
    monkeypatch.setitem(presets.PRESETS, "tok-test", ModelConfig(vocab_size=320, seq_len=32, d_model=32, n_layer=2, n_head=2))
    config = dataclasses.replace(
        small_run(tokens=12_000, preset="tok-test"), data=DataConfig(token_paths=(str(out),), val_fraction=0.1, eval_windows=8)
    )
    assembly = Assembly.build(config)
    require_vocab(assembly.corpus, assembly.model_config.vocab_size)  # where the job checks model against data
    val = assembly.corpus.val
    assert isinstance(val, TokenStream) and assembly.corpus.val_files == ()  # one shard: its tail is held out
    held_out = val.windows(torch.tensor([0]), len(val))[0].tolist()
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    assert text.endswith(tokenizer.decode(held_out)) and len(tokenizer.decode(held_out)) > len(text) // 20
    first_x = assembly.val[0][0][0].tolist()
    assert first_x == held_out[:32]  # the evaluation windows are the held-out tokens
    untrained = assembly.evaluate(assembly.initial)  # bits per byte: per token over the bytes a token stands for
    per_token = assembly.corpus.val_bytes_per_token
    assert per_token is not None and per_token > 1.5  # BPE merges bytes
    assert abs(untrained * per_token - math.log2(320)) < 1.0  # bits per token of a near-uniform model over 320 ids
    run = train_decoupled(config)
    losses = [loss for _, loss in run["loss_curve"]]
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert math.isfinite(run["val_bpb"]) and run["val_bpb"] < untrained - 1.0 / per_token
    bytes_model = dataclasses.replace(config, inner=dataclasses.replace(config.inner, preset="tiny"))
    with pytest.raises(ConfigError, match="the model's vocab_size is 256 but the data .* has vocab_size 320"):
        Assembly.build(bytes_model)  # refused before a model is built, naming both and the fix

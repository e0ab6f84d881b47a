"""Corpus loading and splitting, learner shards, replayable batches, validation windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddctl_agents.train.config import ConfigError, DataConfig
from ddctl_agents.train.data import (
    BatchSampler,
    in_validation,
    load_corpus,
    shard,
    validation_batches,
)


def write_files(root: Path, count: int, size: int = 300) -> dict[str, bytes]:
    """Files with unique content, so each can be found again in the corpus."""
    contents = {}
    for i in range(count):
        rel = f"pkg{i % 3}/mod{i:03d}.py"
        body = (f"# file {i:03d}\n" * size).encode()[:size]
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
        contents[f"{root.name}/{rel}"] = body
    return contents


def occurs(needle: bytes, haystack: torch.Tensor) -> bool:
    return needle in haystack.numpy().tobytes()


def test_default_corpus_is_the_stdlib_split_by_file() -> None:
    corpus = load_corpus(DataConfig(max_bytes=1 << 20))
    assert corpus.source.startswith("stdlib:")
    assert corpus.train.dtype == corpus.val.dtype == torch.uint8
    assert len(corpus.train) > 0 and len(corpus.val) > 0
    assert len(corpus.train) + len(corpus.val) == 1 << 20
    assert 0 < len(corpus.val_files) < corpus.files
    assert all(in_validation(rel, 0.05) for rel in corpus.val_files)
    assert not any("site-packages" in rel for rel in corpus.val_files)
    assert load_corpus(DataConfig(max_bytes=1 << 20)).sha256 == corpus.sha256


def test_user_folder_splits_whole_files_by_path_hash(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    contents = write_files(root, 60)
    corpus = load_corpus(DataConfig(paths=(root,), val_fraction=0.2))
    assert corpus.files == 60
    assert corpus.source == f"paths:{root}"
    assert set(corpus.val_files) == {rel for rel in contents if in_validation(rel, 0.2)}
    for rel, body in contents.items():
        held_out = rel in corpus.val_files
        assert occurs(body, corpus.val) == held_out, rel
        assert occurs(body, corpus.train) != held_out, rel


def test_hidden_folders_are_skipped_and_sha_tracks_content(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    write_files(root, 20)
    (root / ".git").mkdir()
    (root / ".git" / "secret").write_bytes(b"HIDDEN-CONTENT" * 10)
    config = DataConfig(paths=(root,))
    before = load_corpus(config)
    assert not occurs(b"HIDDEN-CONTENT", torch.cat([before.train, before.val]))
    (root / "pkg0" / "mod000.py").write_bytes(b"changed")
    assert load_corpus(config).sha256 != before.sha256


def test_max_bytes_truncates_in_sorted_order(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    write_files(root, 30, size=1000)
    corpus = load_corpus(DataConfig(paths=(root,), max_bytes=4500))
    assert len(corpus.train) + len(corpus.val) == 4500
    assert corpus.files == 5


def test_single_file_falls_back_to_a_byte_split(tmp_path: Path) -> None:
    path = tmp_path / "one.txt"
    path.write_bytes(bytes(range(256)) * 40)
    corpus = load_corpus(DataConfig(paths=(path,), val_fraction=0.05))
    assert corpus.val_files == ()
    assert len(corpus.val) == int(10240 * 0.05)
    everything = torch.tensor(list(range(256)) * 40, dtype=torch.uint8)
    assert torch.equal(torch.cat([corpus.train, corpus.val]), everything)


def test_missing_path_and_empty_folder_are_config_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=str(missing)):
        load_corpus(DataConfig(paths=(missing,)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no data"):
        load_corpus(DataConfig(paths=(tmp_path / "empty",)))


def test_shards_are_disjoint_equal_interleaved_and_cover() -> None:
    data = torch.arange(103)
    parts = [shard(data, i, 4, block=5) for i in range(4)]
    assert [len(p) for p in parts] == [25] * 4
    assert torch.equal(torch.sort(torch.cat(parts)).values, data[:100])
    assert parts[1][:5].tolist() == [5, 6, 7, 8, 9] and parts[1][5:10].tolist() == [25, 26, 27, 28, 29]
    small = [shard(data, i, 4) for i in range(4)]  # a block larger than the data: one block each
    assert torch.equal(torch.sort(torch.cat(small)).values, data[:100])
    with pytest.raises(ConfigError, match="learner"):
        shard(data, 4, 4)


def test_batch_is_a_pure_function_of_seed_stream_step() -> None:
    data = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0)).byte()
    sampler = BatchSampler(data, batch_size=4, seq_len=32, seed=1, stream=0)
    x, y = sampler.batch(7)
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    fresh = BatchSampler(data, batch_size=4, seq_len=32, seed=1, stream=0)
    fresh.batch(0)
    assert torch.equal(fresh.batch(7)[0], x)
    assert not torch.equal(sampler.batch(8)[0], x)
    assert not torch.equal(BatchSampler(data, 4, 32, seed=1, stream=1).batch(7)[0], x)
    assert not torch.equal(BatchSampler(data, 4, 32, seed=2, stream=0).batch(7)[0], x)


def test_batches_are_windows_of_the_data() -> None:
    data = torch.arange(300).byte()  # strictly increasing: a window is x[0] .. x[0] + seq_len
    x, y = BatchSampler(data, batch_size=8, seq_len=16, seed=0, stream=0).batch(0)
    assert torch.equal(y, x + 1)
    assert torch.equal(x, x[:, :1] + torch.arange(16))


def test_validation_windows_are_even_and_deterministic() -> None:
    val = torch.arange(250).byte()
    batches = validation_batches(val, seq_len=9, windows=5, batch_size=2)
    assert [len(x) for x, _ in batches] == [2, 2, 1]
    firsts = torch.cat([x[:, 0] for x, _ in batches]).tolist()
    assert firsts == [0, 60, 120, 180, 240]  # last window ends on the last byte
    assert batches[-1][1][-1, -1].item() == 249
    again = validation_batches(val, seq_len=9, windows=5, batch_size=2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))
    with pytest.raises(ConfigError, match="validation data"):
        validation_batches(val[:9], seq_len=9, windows=1, batch_size=1)

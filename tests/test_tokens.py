"""Token shards: the format read back exactly, refused at the trust boundary with the reason,
split stably into train and validation, and shared between learners without overlap."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
import torch
from moto.server import ThreadedMotoServer

from ddctl_agents.errors import ConfigError
from ddctl_agents.train.config import DataConfig
from ddctl_agents.train.data import (
    BatchSampler,
    TokenStream,
    dataset_vocab_size,
    in_validation,
    load_corpus,
    require_vocab,
    shard,
    validation_batches,
)
from ddctl_agents.train.tokens import ShardWriter, find_shards


def write_shards(folder: Path, tokens: np.ndarray, *, vocab_size: int, shard_tokens: int, text_bytes: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(folder, vocab_size=vocab_size, shard_tokens=shard_tokens)
    writer.add(tokens, text_bytes=text_bytes)
    writer.close()


def unique_tokens(folder: Path, count: int, shard_tokens: int) -> np.ndarray:
    """Shards whose every token id is its position: a window says exactly where it was cut."""
    tokens = np.arange(count)
    write_shards(folder, tokens, vocab_size=2**20, shard_tokens=shard_tokens)
    return tokens


def sidecar(bin_path: Path) -> dict:
    return dict(json.loads(bin_path.with_suffix(".json").read_text()))


def rewrite(bin_path: Path, data: bytes, **fields: object) -> None:
    """Replace a shard's bytes and sidecar fields (sha256 recomputed unless given)."""
    bin_path.write_bytes(data)
    meta = sidecar(bin_path) | {"sha256": hashlib.sha256(data).hexdigest(), "count": len(data) // 2} | fields
    bin_path.with_suffix(".json").write_text(json.dumps(meta))


def test_shards_read_back_exactly_with_true_sidecars(tmp_path: Path) -> None:
    tokens = np.random.default_rng(0).integers(0, 1000, 2500)
    write_shards(tmp_path / "out", tokens, vocab_size=1000, shard_tokens=1000, text_bytes=9001)
    shards = find_shards([str(tmp_path / "out")])
    assert [s.meta.name for s in shards] == [f"out/tokens_00000{i}.bin" for i in range(3)]
    assert [s.meta.count for s in shards] == [1000, 1000, 500]
    assert np.array_equal(np.concatenate([s.tokens() for s in shards]), tokens)
    first = tmp_path / "out" / "tokens_000000.bin"
    meta = sidecar(first)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 1000 and meta["count"] == 1000
    assert meta["sha256"] == hashlib.sha256(first.read_bytes()).hexdigest()
    assert first.stat().st_size == 2000 and np.array_equal(np.fromfile(first, dtype="<u2"), tokens[:1000])
    assert sum(s.meta.text_bytes or 0 for s in shards) == 9001
    stream = TokenStream.whole(shards)  # windows across shard boundaries are the same tokens
    assert torch.equal(
        stream.windows(torch.tensor([990, 1995]), 20),
        torch.from_numpy(tokens[[*range(990, 1010), *range(1995, 2015)]]).reshape(2, 20),
    )


def test_a_large_vocabulary_is_written_as_uint32(tmp_path: Path) -> None:
    tokens = np.array([0, 65535, 65536, 99_999])
    write_shards(tmp_path, tokens, vocab_size=100_000, shard_tokens=10)
    (shard_,) = find_shards([str(tmp_path)])
    assert shard_.meta.dtype == "uint32" and (tmp_path / "tokens_000000.bin").stat().st_size == 16
    assert shard_.tokens().tolist() == tokens.tolist()


def test_a_file_of_the_wrong_size_is_refused_naming_it(tmp_path: Path) -> None:
    write_shards(tmp_path, np.arange(100), vocab_size=256, shard_tokens=100)
    path = tmp_path / "tokens_000000.bin"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ConfigError, match=r"tokens_000000\.bin: 197 bytes, but its sidecar promises 100 uint16 = 200"):
        find_shards([str(tmp_path)])


def test_a_token_beyond_the_vocabulary_is_refused(tmp_path: Path) -> None:
    write_shards(tmp_path, np.arange(100), vocab_size=256, shard_tokens=100)
    path = tmp_path / "tokens_000000.bin"
    rewrite(path, np.array([1, 2, 300, 4], dtype="<u2").tobytes())
    (shard_,) = find_shards([str(tmp_path)])  # sidecars are read first; tokens when first used
    with pytest.raises(ConfigError, match=r"tokens_000000\.bin: holds token id 300; ids must be below vocab_size=256"):
        shard_.tokens()


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"dtype": "int64"}, r"dtype must be one of uint16, uint32, got 'int64'"),
        ({"vocab_size": 70_000}, r"vocab_size must be an integer in \[2, 65536\] for uint16, got 70000"),
        ({"count": 0}, r"count must be an integer >= 1"),
        ({"sha256": "abc"}, r"sha256 must be 64 lowercase hex digits"),
    ],
)
def test_a_bad_sidecar_is_refused_with_what_is_allowed(tmp_path: Path, fields: dict, reason: str) -> None:
    write_shards(tmp_path, np.arange(10), vocab_size=256, shard_tokens=100)
    path = tmp_path / "tokens_000000.bin"
    rewrite(path, path.read_bytes(), **fields)
    with pytest.raises(ConfigError, match=rf"tokens_000000\.json: {reason}"):
        find_shards([str(tmp_path)])


def test_a_sidecar_json_cannot_parse_is_refused_naming_it(tmp_path: Path) -> None:
    """An integer past Python's 4300 digits raised a bare ValueError (a sidecar may come from object storage)."""
    write_shards(tmp_path, np.arange(10), vocab_size=256, shard_tokens=100)
    (tmp_path / "tokens_000000.json").write_bytes(b'{"count": ' + b"9" * 5000 + b"}")
    with pytest.raises(ConfigError, match=r"tokens_000000\.json: not a JSON sidecar \(Exceeds the limit"):
        find_shards([str(tmp_path)])


def test_a_shard_whose_sha256_differs_is_refused(tmp_path: Path) -> None:
    write_shards(tmp_path, np.arange(100), vocab_size=256, shard_tokens=100)
    path = tmp_path / "tokens_000000.bin"
    data = bytearray(path.read_bytes())
    data[10] ^= 1  # same size, same vocabulary, different content
    path.write_bytes(bytes(data))
    (shard_,) = find_shards([str(tmp_path)])
    with pytest.raises(ConfigError, match=r"tokens_000000\.bin: sha256 [0-9a-f]{64} differs from its sidecar's"):
        shard_.tokens()


def test_missing_sidecars_paths_and_mixed_vocabularies_are_refused(tmp_path: Path) -> None:
    (tmp_path / "lone.bin").write_bytes(b"\0\0")
    with pytest.raises(ConfigError, match=r"has no sidecar .*lone\.json"):
        find_shards([str(tmp_path / "lone.bin")])
    with pytest.raises(ConfigError, match="does not exist"):
        find_shards([str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no \*\.bin token shards under"):
        find_shards([str(tmp_path / "empty")])
    write_shards(tmp_path / "a", np.arange(10), vocab_size=256, shard_tokens=100)
    write_shards(tmp_path / "b", np.arange(10), vocab_size=512, shard_tokens=100)
    with pytest.raises(ConfigError, match="disagree on vocab_size: .* has 256, .* has 512"):
        find_shards([str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(ConfigError, match="not both"):
        DataConfig(paths=(tmp_path,), token_paths=(str(tmp_path / "a"),))


def test_the_validation_split_is_by_shard_name_and_stable(tmp_path: Path) -> None:
    unique_tokens(tmp_path / "data", 40 * 50, shard_tokens=50)
    config = DataConfig(token_paths=(str(tmp_path / "data"),), val_fraction=0.2)
    corpus = load_corpus(config)
    names = [f"data/tokens_{i:06d}.bin" for i in range(40)]
    expected = {n for n in names if in_validation(n, 0.2)}
    assert set(corpus.val_files) == expected and 0 < len(expected) < 40
    assert corpus.files == 40 and corpus.vocab_size == 2**20 and corpus.source == f"tokens:{tmp_path / 'data'}"
    assert isinstance(corpus.val, TokenStream) and isinstance(corpus.train, TokenStream)
    assert len(corpus.train) + len(corpus.val) == 2000 and len(corpus.val) == 50 * len(expected)
    val = set(corpus.val.windows(torch.tensor([0]), len(corpus.val))[0].tolist())
    train = set(corpus.train.windows(torch.tensor([0]), len(corpus.train))[0].tolist())
    assert not val & train and {i // 50 for i in val} == {int(n[-10:-4]) for n in expected}
    again = load_corpus(config)
    assert again.val_files == corpus.val_files and again.sha256 == corpus.sha256
    write_shards(tmp_path / "more", np.arange(50), vocab_size=2**20, shard_tokens=50)  # another shard moves no other
    grown = load_corpus(DataConfig(token_paths=(str(tmp_path / "data"), str(tmp_path / "more")), val_fraction=0.2))
    assert set(grown.val_files) - {"more/tokens_000000.bin"} == expected and grown.sha256 != corpus.sha256


def test_one_shard_holds_out_its_tail(tmp_path: Path) -> None:
    unique_tokens(tmp_path, 1000, shard_tokens=1000)
    corpus = load_corpus(DataConfig(token_paths=(str(tmp_path / "tokens_000000.bin"),), val_fraction=0.1))
    assert corpus.val_files == () and (len(corpus.train), len(corpus.val)) == (900, 100)
    assert corpus.val.windows(torch.tensor([0]), 100)[0].tolist() == list(range(900, 1000))
    batches = validation_batches(corpus.val, 9, windows=4, batch_size=2)
    assert [x[:, 0].tolist() for x, _ in batches] == [[900, 930], [960, 990]]
    assert all(torch.equal(y[:, :-1], x[:, 1:]) for x, y in batches)


def seen_by(data: torch.Tensor | TokenStream, stream: int, steps: int = 60) -> set[int]:
    sampler = BatchSampler(data, batch_size=8, seq_len=16, seed=0, stream=stream)
    seen: set[int] = set()
    for step in range(steps):
        x, y = sampler.batch(step)
        seen |= set(x.flatten().tolist()) | set(y.flatten().tolist())
    return seen


@pytest.mark.parametrize(("shard_tokens", "whole_shards"), [(100, True), (4000, False)], ids=["many-shards", "one-shard"])
def test_two_learners_never_see_the_same_token_window(tmp_path: Path, shard_tokens: int, whole_shards: bool) -> None:
    unique_tokens(tmp_path, 4000, shard_tokens=shard_tokens)
    corpus = load_corpus(DataConfig(token_paths=(str(tmp_path),), val_fraction=0.05))
    shares = [shard(corpus.train, i, 2, block=64) for i in range(2)]
    assert all(isinstance(s, TokenStream) for s in shares)
    first, second = seen_by(shares[0], stream=0), seen_by(shares[1], stream=1)
    assert len(first) > 500 and len(second) > 500 and not first & second
    whole = [set(s.windows(torch.tensor([0]), len(s))[0].tolist()) for s in shares]  # the shares themselves
    assert not whole[0] & whole[1] and min(map(len, whole)) > 1000
    val = set(corpus.val.windows(torch.tensor([0]), len(corpus.val))[0].tolist())
    assert not (whole[0] | whole[1]) & val
    if whole_shards:  # each learner reads whole shards of its own
        assert all(len(w) == shard_tokens * len({t // shard_tokens for t in w}) for w in whole)
    else:  # blocks of the one shard, alternating
        assert {t // 64 % 2 for t in whole[0]} == {0} and {t // 64 % 2 for t in whole[1]} == {1}


def test_the_vocab_is_the_sidecars_and_a_model_must_match_it(tmp_path: Path) -> None:
    write_shards(tmp_path, np.arange(2000) % 700, vocab_size=700, shard_tokens=2000, text_bytes=5000)
    config = DataConfig(token_paths=(str(tmp_path),))
    corpus = load_corpus(config)
    assert dataset_vocab_size(config) == corpus.vocab_size == 700
    assert corpus.val_bytes_per_token == pytest.approx(2.5)
    require_vocab(corpus, 700)
    with pytest.raises(ConfigError, match="the model's vocab_size is 256 but the data .* has vocab_size 700"):
        require_vocab(corpus, 256)
    assert dataset_vocab_size(DataConfig()) == 256


class FakeStorage:
    """Objects by URL; records every get and enforces max_bytes, as storage.get does."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects, self.gets = objects, []

    def get(self, url: str, max_bytes: int | None = None) -> bytes:
        self.gets.append(url)
        data = self.objects[url]
        if max_bytes is not None and len(data) > max_bytes:
            raise ValueError(f"{url} is over {max_bytes} bytes")
        return data

    def listing(self, prefix: str) -> list[str]:
        return sorted(u for u in self.objects if u.startswith(prefix))


def uploaded(folder: Path, prefix: str) -> dict[str, bytes]:
    return {f"{prefix}{p.name}": p.read_bytes() for p in sorted(folder.iterdir())}


def test_remote_shards_are_downloaded_once_checked_and_split_like_local_ones(tmp_path: Path) -> None:
    tokens = unique_tokens(tmp_path / "shards", 40 * 50, shard_tokens=50)
    storage = FakeStorage(uploaded(tmp_path / "shards", "s3://bucket/data/shards/"))
    cache = tmp_path / "cache"
    config = DataConfig(token_paths=("s3://bucket/data/shards",), val_fraction=0.2)
    local = load_corpus(DataConfig(token_paths=(str(tmp_path / "shards"),), val_fraction=0.2))
    corpus = load_corpus(config, storage=storage, cache=cache)
    assert corpus.val_files == local.val_files and corpus.sha256 == local.sha256  # same names: same split
    assert not any(u.endswith(".bin") for u in storage.gets)  # only sidecars so far
    every = corpus.train.windows(torch.tensor([0]), len(corpus.train))[0]
    assert torch.equal(every, local.train.windows(torch.tensor([0]), len(local.train))[0])
    assert set(every.tolist()) <= set(tokens.tolist())
    assert sorted(p.name for p in cache.glob("*.bin")) == sorted(f"{s.meta.sha256}.bin" for s in corpus.train.shards())
    learners = 40 - len(corpus.val_files)  # one training shard each
    mine = shard(load_corpus(config, storage=storage, cache=cache).train, 0, learners)
    assert isinstance(mine, TokenStream) and len(mine.shards()) == 1
    before = len(storage.gets)
    first = BatchSampler(mine, 1, 8, seed=0, stream=0).batch(0)[0]  # cached: nothing downloaded again
    assert len(storage.gets) == before
    cached = cache / f"{mine.shards()[0].meta.sha256}.bin"
    cached.write_bytes(bytes(cached.stat().st_size))  # a cache file damaged in place
    with pytest.raises(ConfigError, match="sha256 .* differs from its sidecar's"):
        BatchSampler(shard(load_corpus(config, storage=storage, cache=cache).train, 0, learners), 1, 8, seed=0, stream=0).batch(0)
    assert not cached.exists()  # thrown away, so the next attempt downloads it again
    again = shard(load_corpus(config, storage=storage, cache=cache).train, 0, learners)
    assert torch.equal(BatchSampler(again, 1, 8, seed=0, stream=0).batch(0)[0], first)
    assert len(storage.gets) > before and cached.exists()


def test_a_remote_shard_that_does_not_match_its_sidecar_is_refused(tmp_path: Path) -> None:
    unique_tokens(tmp_path / "shards", 100, shard_tokens=100)
    objects = uploaded(tmp_path / "shards", "gs://b/shards/")
    data = bytearray(objects["gs://b/shards/tokens_000000.bin"])
    data[0] ^= 1
    objects["gs://b/shards/tokens_000000.bin"] = bytes(data)
    corpus = load_corpus(DataConfig(token_paths=("gs://b/shards/",)), storage=FakeStorage(objects), cache=tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"gs://b/shards/tokens_000000\.bin: downloaded 400 bytes whose sha256 differs"):
        validation_batches(corpus.val, 4, windows=2, batch_size=2)
    assert not list((tmp_path / "cache").glob("*.bin"))


@pytest.fixture
def s3_bucket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """A bucket on a real moto S3 server, which ddctl_agents.storage reaches through AWS_ENDPOINT_URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_ENDPOINT_URL": f"http://{host}:{port}"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client = boto3.session.Session().client("s3")
    client.create_bucket(Bucket="tokens")
    try:
        yield client
    finally:
        server.stop()


def test_shards_in_s3_train_like_local_ones_through_the_storage_module(tmp_path: Path, s3_bucket: Any) -> None:
    unique_tokens(tmp_path / "shards", 12 * 100, shard_tokens=100)
    for path in sorted((tmp_path / "shards").iterdir()):
        s3_bucket.put_object(Bucket="tokens", Key=f"runs/shards/{path.name}", Body=path.read_bytes())
    local = load_corpus(DataConfig(token_paths=(str(tmp_path / "shards"),), val_fraction=0.2))
    remote = load_corpus(DataConfig(token_paths=("s3://tokens/runs/shards/",), val_fraction=0.2), cache=tmp_path / "cache")
    assert (remote.files, remote.val_files, remote.sha256, remote.vocab_size) == (12, local.val_files, local.sha256, 2**20)
    for learner in range(3):
        mine, theirs = shard(remote.train, learner, 3), shard(local.train, learner, 3)
        assert torch.equal(
            BatchSampler(mine, 4, 16, seed=0, stream=learner).batch(5)[0],
            BatchSampler(theirs, 4, 16, seed=0, stream=learner).batch(5)[0],
        )
    assert isinstance(remote.train, TokenStream)
    assert len(list((tmp_path / "cache").glob("*.bin"))) == len(remote.train.shards())  # each downloaded once

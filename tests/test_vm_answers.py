"""What the laptop takes from a VM (exit summaries, the syncer's result, files out of a container) is another
machine's answer: of any shape, it is refused or escaped, and never stops the loop that replaces lost learners."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import logging
import math
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ddctl.control import jobdata, pull
from ddctl.control.controller import Controller, finished
from ddctl.control.finish import parse_result
from ddctl.control.jobdata import builtin_parameters, builtin_shapes, checkpoint_shapes
from ddctl.control.pull import Source, fetch
from ddctl.control.state import State
from ddctl.errors import DdctlError
from ddctl.providers import console, deploy
from ddctl.providers.base import Instance
from ddctl.providers.docker.engine import Engine
from ddctl.providers.docker.vms import DockerProvider
from ddctl.providers.fake import FakeProvider
from ddctl.providers.process import ProcessProvider
from ddctl_agents.errors import CheckpointError
from ddctl_agents.train.checkpoint import FORMAT, MANIFEST, MODEL
from ddctl_agents.train.config import ModelConfig
from ddctl_agents.train.presets import get_preset
from tests.builders import controller_world

RUN = "r"
ZONES = [{"provider": "fake", "cloud_region": "eu", "zone": "eu-a"}]
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
def world(tmp_path: Path) -> tuple[State, FakeProvider, Controller]:
    return controller_world(tmp_path, RUN, ZONES)


@pytest.mark.parametrize("summary", [b"[]", b"1", b'"finished"', b"null", DEEP])
def test_an_exit_summary_that_is_not_an_object_is_not_finished_and_said_escaped(
    summary: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ddctl.control.controller"):
        assert finished(summary) is False
    [record] = caplog.records
    assert "taken as not finished" in record.getMessage() and "\n" not in record.getMessage()


@pytest.mark.parametrize("summary", [b"[]", DEEP])
def test_a_learners_bad_summary_does_not_stop_the_others_being_replaced(
    world: tuple[State, FakeProvider, Controller], summary: bytes
) -> None:
    state, fake, controller = world
    fake.end(RUN, "L0")  # preempted: replaced
    fake.end(RUN, "L1", summary=summary)  # not a summary: not finished, so replaced too
    fake.end(RUN, "syncer")
    controller.once(now=0.0)
    assert [c for c in fake.calls if c[0] == "create"] == [
        ("create", "syncer@eu/eu-a"),
        ("create", "L0@eu/eu-a"),
        ("create", "L1@eu/eu-a"),
    ]


def test_an_instance_whose_end_cannot_be_read_waits_and_the_others_are_handled(
    world: tuple[State, FakeProvider, Controller], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, fake, controller = world
    fake.end(RUN, "L0")
    fake.end(RUN, "L1")
    real = fake.read_file

    def read_file(instance: Instance, path: str) -> bytes | None:
        if instance.name == "L1":
            raise KeyError("a bad answer\x1b[2J\nforged")
        return real(instance, path)

    monkeypatch.setattr(fake, "read_file", read_file)
    actions = controller.once(now=0.0)
    assert [(a.kind, a.name) for a in actions] == [("retire", "L0"), ("replace", "L0")]
    controller.once(now=1.0)  # said once per reason, escaped
    [said] = [e for e in state.events(RUN, 100) if e.get("kind") == "error"]
    assert said["instance"] == "L1" and "KeyError" in said["reason"] and "\\x1b" in said["reason"]
    assert "\n" not in said["reason"]
    monkeypatch.setattr(fake, "read_file", real)  # it answers again: handled at the next pass
    assert [(a.kind, a.name) for a in controller.once(now=2.0)] == [("retire", "L1"), ("replace", "L1")]


@pytest.mark.parametrize("result", [b'{"reason": 5}', b"[]", DEEP])
def test_a_syncers_result_of_another_shape_is_said_and_its_learners_still_replaced(
    world: tuple[State, FakeProvider, Controller], result: bytes
) -> None:
    """A result that could not be parsed ended the pass before any learner was handled: none was replaced again."""
    state, fake, controller = world
    fake.end(RUN, "syncer", summary=result)
    fake.end(RUN, "L0")
    actions = controller.once(now=0.0)
    assert ("replace", "L0") in [(a.kind, a.name) for a in actions]
    assert state.run(RUN).state == "training"  # not concluded on a result it cannot read
    [said] = [e for e in state.events(RUN, 100) if e.get("kind") == "error"]
    assert said["instance"] == "syncer" and "whether syncer finished is unknown" in said["reason"]


def engine_answering(tar: bytes) -> Engine:
    engine = Engine.__new__(Engine)
    engine.http = httpx.Client(
        transport=httpx.MockTransport(lambda _: httpx.Response(200, content=tar)), base_url="http://docker"
    )
    return engine


def archive(kind: bytes, name: str = "summary.json", linkname: str = "", data: bytes = b"") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, linkname, len(data)
        tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


@pytest.mark.parametrize(
    "tar",
    [
        archive(tarfile.SYMTYPE, linkname="/etc/hostname"),
        archive(tarfile.LNKTYPE, linkname="other"),
        archive(tarfile.DIRTYPE),
        archive(tarfile.CHRTYPE),
        archive(tarfile.FIFOTYPE),
    ],
)
def test_a_container_file_that_is_not_a_regular_file_is_none_as_a_missing_one(tar: bytes) -> None:
    assert engine_answering(tar).get_file("c1", "/opt/ddctl/summary.json") is None


def test_a_container_regular_file_is_its_bytes() -> None:
    assert engine_answering(archive(tarfile.REGTYPE, data=b'{"a": 1}')).get_file("c1", "/s.json") == b'{"a": 1}'


def test_a_container_file_over_its_limit_is_too_large_and_read_no_further_than_the_limit() -> None:
    sent = [0]

    def endless() -> Iterator[bytes]:  # a tar header declaring 20 GiB, then data without end
        info = tarfile.TarInfo("summary.json")
        info.size = 20 << 30
        yield info.tobuf()
        while True:
            sent[0] += 1 << 16
            yield b"x" * (1 << 16)

    engine = Engine.__new__(Engine)
    answer = lambda _: httpx.Response(200, content=endless())  # noqa: E731
    engine.http = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://docker")
    with pytest.raises(deploy.TooLarge, match="larger than the 1048576 bytes"):
        engine.get_file("c1", "/opt/ddctl/summary.json", deploy.SUMMARY_LIMIT)
    assert sent[0] <= deploy.SUMMARY_LIMIT + (2 << 20)  # the limit, the framing, a chunk: not 20 GiB
    declared = archive(tarfile.REGTYPE, data=b"y" * 5000)  # a whole archive whose file is over the limit
    with pytest.raises(deploy.TooLarge, match="5000 bytes, larger than the 4096"):
        engine_answering(declared).get_file("c1", "/s.json", 4096)
    assert engine_answering(declared).get_file("c1", "/s.json", 5000) == b"y" * 5000


def test_a_docker_vms_log_past_its_limit_is_named_in_its_place_and_the_container_still_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    removed: list[str] = []
    engine = engine_answering(archive(tarfile.REGTYPE, name="agent.log", data=b"z" * 3000))
    monkeypatch.setattr(engine, "remove", removed.append, raising=False)
    monkeypatch.setattr(deploy, "LOG_LIMIT", 2048)
    vms = DockerProvider.__new__(DockerProvider)
    vms.engine = engine
    vms.retire(Instance(name="L0", provider_id="c1", run=RUN, alive=False), tmp_path / "L0.log")
    text = (tmp_path / "L0.log").read_text()
    assert "the agent's log was not collected" in text and "3000 bytes" in text and "z" not in text
    assert removed == ["c1"]


def result(**change: object) -> bytes:
    books = ("budget", "planned", "trained", "received", "merged", "late_merged", "dropped", "rejected", "pending")
    good = {
        "run": "r", "reason": "finished", "finished_at": 1.0, "uptime_s": 1.0, "quorum_s": 1.0, "goodput": 0.5,
        "rounds": 1, "val_bpb": 1.0, "bytes_up": 0, "bytes_down": 0, "learners_finished": ["L0", "L1-n1"],
        "state_dir": "/x", "checkpoint": "/x/ckpt", "tokens": dict.fromkeys(books, 0),
    }  # fmt: skip
    return json.dumps(good | change).encode()


def test_the_syncers_strings_are_escaped_so_the_run_still_concludes() -> None:
    read = parse_result(result(reason="budget\x1b]0;pwned\x07\nINFO forged", run="r\x00", state_dir="/x\n", checkpoint="/c\x9b"))
    assert read is not None
    assert read.reason == "budget\\x1b]0;pwned\\x07\\nINFO forged"
    assert (read.run, read.state_dir, read.checkpoint) == ("r\\x00", "/x\\n", "/c\\x9b")
    assert read.learners_finished == ["L0", "L1-n1"]
    plain = parse_result(result())
    assert plain is not None and (plain.reason, plain.checkpoint) == ("finished", "/x/ckpt")


@pytest.mark.parametrize("name", ["L0\x1b[31m", "", "-L0", "L0 L1", "x" * 65])
def test_a_finished_learner_not_named_as_a_learner_is_refused(name: str) -> None:
    with pytest.raises(DdctlError, match=r"malformed at learners_finished\.0"):
        parse_result(result(learners_finished=[name]))


def test_a_result_nested_past_the_stack_is_a_malformed_summary() -> None:
    with pytest.raises(DdctlError, match="summary.json is not JSON"):
        parse_result(DEEP)


def test_a_learner_whose_summary_is_too_large_is_not_finished_and_is_replaced(
    world: tuple[State, FakeProvider, Controller], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, fake, controller = world
    fake.end(RUN, "L1")

    real = fake.read_file

    def read_file(instance: Instance, path: str) -> bytes | None:
        if instance.name != "L1":
            return real(instance, path)
        raise deploy.TooLarge(f"{instance.name}:{path}: larger than the 1048576 bytes it may be; not read")

    monkeypatch.setattr(fake, "read_file", read_file)
    assert [(a.kind, a.name) for a in controller.once(now=0.0)] == [("retire", "L1"), ("replace", "L1")]


def manifest_source(model: dict[str, object], model_bytes: int = 1 << 30) -> Source:
    body = {
        "format": FORMAT, "run": "r", "created_at": 1.0, "rounds": 1, "versions": [], "vclock": {}, "tokens": {},
        "steps": {}, "val_bpb": None, "model": model, "job": {"inner": {}}, "job_sha256": "0" * 64,
        "files": {MODEL: {"bytes": model_bytes, "sha256": "0" * 64}},
    }  # fmt: skip

    def read(name: str, limit: int) -> bytes:
        if name == MANIFEST:
            return json.dumps(body).encode()
        raise FileNotFoundError(name)  # no index: one checkpoint; the model file is never reached

    return Source("vm:/ckpt", read)


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ({"d_model": 2**40, "n_head": 1}, "parameters"),
        ({"d_model": 2**62, "vocab_size": 2**62, "n_head": 1}, "parameters"),
        ({"seq_len": 10**18}, "parameters"),
        ({"n_layer": 10**7, "d_model": 1, "n_head": 1}, "at most 1024 blocks"),
        ({"n_layer": 1000, "n_experts": 1000, "d_model": 1, "n_head": 1, "top_k": 1}, "16384 MLPs in all"),
    ],
)
def test_a_manifests_model_its_file_cannot_hold_is_bad_data_before_anything_is_built(model: dict[str, object], says: str) -> None:
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=f"vm:/ckpt/.: model.safetensors: .*{says}"):
        fetch(manifest_source(model))
    assert time.monotonic() - started < 5


def test_a_model_that_fits_its_file_by_one_parameter_less_is_refused() -> None:
    config = get_preset("micro")
    need = 4 * builtin_parameters(config)
    assert checkpoint_shapes(config, need, MODEL)  # exactly its float32 bytes: built
    with pytest.raises(CheckpointError, match=rf"\({need} bytes as float32\), more than the {need - 4} bytes"):
        checkpoint_shapes(config, need - 4, MODEL)


def test_a_model_that_cannot_be_built_is_bad_data_naming_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def overflow(config: ModelConfig) -> dict[str, tuple[int, ...]]:
        raise RuntimeError("Storage size calculation overflowed\n")

    monkeypatch.setattr(jobdata, "builtin_shapes", overflow)
    with pytest.raises(CheckpointError, match=r"model.safetensors: its model config cannot be built: .*overflowed\\n"):
        checkpoint_shapes(get_preset("micro"), 1 << 30, MODEL)


@pytest.mark.parametrize("preset", ["micro", "tiny-moe", "base"])
@pytest.mark.parametrize("tied", [True, False])
def test_the_parameter_count_is_the_built_models(preset: str, tied: bool) -> None:
    config = dataclasses.replace(get_preset(preset), tie_embeddings=tied)
    shapes = builtin_shapes(config)
    assert builtin_parameters(config) == sum(math.prod(shape) for shape in shapes.values())
    assert checkpoint_shapes(config, 4 * builtin_parameters(config) + 4096, MODEL) == shapes


def test_a_checkpoint_file_is_read_off_the_syncers_vm_no_further_than_its_manifest_says(
    world: tuple[State, FakeProvider, Controller],
) -> None:
    _, fake, _ = world
    [syncer] = [i for i in fake.list_run(RUN) if i.name == "syncer"]
    root = f"{deploy.REMOTE_ROOT}/state/checkpoints"
    fake._slots[(RUN, "syncer")].files[f"{root}/ckpt-000001/model.safetensors"] = b"w" * 11
    source = pull._remote_source(fake, syncer, "fake")
    with pytest.raises(CheckpointError, match=r"checkpoints/ckpt-000001/model.safetensors: .*larger than the 10 bytes"):
        source.read("ckpt-000001/model.safetensors", 10)
    assert source.read("ckpt-000001/model.safetensors", 11) == b"w" * 11
    with pytest.raises(FileNotFoundError):
        source.read("ckpt-000001/outer.safetensors", 10)


def test_every_provider_reads_a_file_no_further_than_the_limit_it_is_given(tmp_path: Path) -> None:
    big = tmp_path / "tape.jsonl"
    big.write_bytes(b"t" * 5000)
    local = ProcessProvider.__new__(ProcessProvider)
    me = Instance(name="S0", provider_id="1", run=RUN, alive=True)
    with pytest.raises(deploy.TooLarge, match="larger than the 4999 bytes"):
        local.read_file(me, str(big), 4999)
    assert local.read_file(me, str(big), 5000) == b"t" * 5000 and local.read_file(me, str(big)) == b"t" * 5000
    assert local.read_file(me, str(tmp_path / "none")) is None
    kept = {f"{tmp_path}/summary.json": b"s" * 100}
    last_words = "".join(f"{console.MARK} {k} {base64.b64encode(v).decode()}\n" for k, v in kept.items())
    unreachable = lambda: (_ for _ in ()).throw(DdctlError("no route"))  # noqa: E731
    with pytest.raises(deploy.TooLarge):  # an ended VM's console is held to the limit as SSH is
        console.read_file(unreachable, lambda: last_words, f"{tmp_path}/summary.json", 99)
    assert console.read_file(unreachable, lambda: last_words, f"{tmp_path}/summary.json") == b"s" * 100

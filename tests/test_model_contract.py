"""A model of your own: the contract's checker, loading, shipping to the VMs, and training through the same paths."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from builders import small_run
from ddctl.config.job import KnobError, build_job
from ddctl.local.training import train_decoupled
from ddctl_agents.errors import ConfigError, ContractError
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.config import InnerConfig, ModelConfig
from ddctl_agents.train.contract import build, check_contract, load_factory, quality_loss, split_spec, training_loss
from ddctl_agents.train.flops import flops_per_token
from ddctl_agents.train.model import build_model, count_parameters
from ddctl_agents.train.modelfiles import MODEL_DIR, digest, pack, ship, unpack

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
TINY_RNN = f"{EXAMPLES / 'tiny_rnn.py'}:build"
HF_MODEL = f"{EXAMPLES / 'hf_model.py'}:build"
SMALL = ModelConfig(seq_len=16, d_model=32, n_layer=2, n_head=4)

BROKEN = '''
import random
import torch
import torch.nn.functional as F
from torch import nn


class LM(nn.Module):
    """A valid little LM; the factories below break one rule each."""

    def __init__(self, config, dtype=torch.float32):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, 8, dtype=dtype)
        self.head = nn.Linear(8, config.vocab_size, dtype=dtype)

    def logits(self, tokens):
        return self.head(self.embed(tokens))

    def forward(self, tokens, targets):
        return F.cross_entropy(self.logits(tokens).flatten(0, 1).float(), targets.flatten())


class PerToken(LM):
    def forward(self, tokens, targets):
        return F.cross_entropy(self.logits(tokens).flatten(0, 1), targets.flatten(), reduction="none")


class NaN(LM):
    def forward(self, tokens, targets):
        return super().forward(tokens, targets) * float("nan")


class Detached(LM):
    def forward(self, tokens, targets):
        return super().forward(tokens, targets).detach()


class Mapping(LM):
    def forward(self, tokens, targets):
        return {"loss": super().forward(tokens, targets)}


class Dropout(LM):
    def forward(self, tokens, targets):
        logits = F.dropout(self.logits(tokens), 0.5, training=self.training)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Unused(LM):
    def __init__(self, config):
        super().__init__(config)
        self.spare = nn.Linear(8, 8)


class Allowed(Unused):
    unused_parameters = ("spare.weight", "spare.bias")


class Running(LM):
    def __init__(self, config):
        super().__init__(config)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, tokens, targets):
        x = self.norm(self.embed(tokens).transpose(1, 2)).transpose(1, 2)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


class Crashes(LM):
    def forward(self, tokens, targets):
        raise RuntimeError("shapes do not line up")


def valid(config):
    return LM(config)

def per_token(config):
    return PerToken(config)

def nan(config):
    return NaN(config)

def detached(config):
    return Detached(config)

def mapping(config):
    return Mapping(config)

def dropout(config):
    return Dropout(config)

def unused(config):
    return Unused(config)

def allowed(config):
    return Allowed(config)

def running(config):
    return Running(config)

def crashes(config):
    return Crashes(config)

def float64(config):
    return LM(config, dtype=torch.float64)

def unseeded(config):
    model = LM(config)
    with torch.no_grad():
        model.head.weight.add_(random.random())
    return model

def not_a_module(config):
    return {"model": LM(config)}

def raises(config):
    raise ValueError("no such size")

def empty(config):
    return nn.Module()

def bad_blocks(config):
    model = LM(config)
    model.blocks = [model.head]
    return model

def bad_embeddings(config):
    model = LM(config)
    model.embedding_names = ("wte.weight",)
    return model

not_callable = 3
'''


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("broken") / "broken_models.py"
    path.write_text(BROKEN)
    return path


def test_the_built_in_passes_the_checker() -> None:
    report = check_contract("", SMALL, fragments=4)
    assert report["params"] == count_parameters(build_model(SMALL, seed=0))
    assert report["flops_per_token"] == flops_per_token(SMALL)
    assert report["blocks"] is True and report["embeddings"] == ["wpe.weight", "wte.weight"]


@pytest.mark.parametrize(("spec", "blocks"), [(TINY_RNN, False), (HF_MODEL, True)], ids=["tiny_rnn", "hf_model"])
def test_each_example_passes_the_checker(spec: str, blocks: bool) -> None:
    report = check_contract(spec, SMALL, fragments=4)
    assert report["params"] > 0 and report["flops_per_token"] == 6 * report["params"]
    assert report["blocks"] is blocks


@pytest.mark.parametrize(
    ("factory", "rule", "says"),
    [
        ("per_token", "output", "shape"),
        ("nan", "output", "finite"),
        ("detached", "output", "grad"),
        ("mapping", "output", ".loss"),
        ("dropout", "determinism", "dropout"),
        ("unseeded", "determinism", "seeded generator"),
        ("unused", "gradients", "unused_parameters"),
        ("running", "buffers", "synchronised"),
        ("crashes", "forward", "shapes do not line up"),
        ("float64", "parameters", "float32"),
        ("empty", "parameters", "no parameters"),
        ("not_a_module", "factory", "dict"),
        ("raises", "factory", "no such size"),
        ("bad_blocks", "blocks", "ModuleList"),
        ("bad_embeddings", "embedding_names", "wte.weight"),
        ("missing", "load", "no attribute 'missing'"),
        ("not_callable", "load", "not a callable"),
    ],
)
def test_a_model_that_breaks_a_rule_is_refused_naming_it(broken: Path, factory: str, rule: str, says: str) -> None:
    with pytest.raises(ContractError) as info:
        check_contract(f"{broken}:{factory}", SMALL)
    assert info.value.rule == rule and says in str(info.value), str(info.value)


def test_parameters_a_model_declares_unused_need_no_gradient(broken: Path) -> None:
    assert check_contract(f"{broken}:allowed", SMALL)["tensors"] == 5


def test_a_layout_with_more_fragments_than_tensors_is_refused(broken: Path) -> None:
    with pytest.raises(ContractError, match="3 tensors cannot make 4 fragments") as info:
        check_contract(f"{broken}:valid", SMALL, fragments=4)
    assert info.value.rule == "fragments"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_such_module_anywhere:build", "no module no_such_module_anywhere"),
        ("/nowhere/model.py:build", "no file /nowhere/model.py"),
    ],
)
def test_a_module_that_cannot_be_found_is_refused(spec: str, says: str) -> None:
    with pytest.raises(ContractError, match=says) as info:
        load_factory(spec)
    assert info.value.rule == "load"


def test_a_module_that_fails_to_import_is_refused_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "fails_on_import.py").write_text("import no_such_dependency_here\n")
    with pytest.raises(ContractError, match="no_such_dependency_here") as info:
        load_factory("fails_on_import:build", tmp_path)
    assert info.value.rule == "load"


@pytest.mark.parametrize("spec", ["model", "a.b:c:d", "a-b:c", "dir/file.txt:build", "mod:1x", ":build"])
def test_a_malformed_spec_is_refused_by_the_config_and_the_loader(spec: str) -> None:
    with pytest.raises(ConfigError, match="package.module:factory"):
        InnerConfig(model=spec)
    with pytest.raises(ContractError) as info:
        split_spec(spec)
    assert info.value.rule == "spec"


def test_the_model_knob_sets_the_inner_config_and_names_itself_when_bad() -> None:
    assert build_job({"model": "my_model.py:build"}).inner.model == "my_model.py:build"
    with pytest.raises(KnobError) as info:
        build_job({"model": "not a spec"})
    assert info.value.knob == "model"


def test_build_is_seeded_and_leaves_the_callers_generator_alone(broken: Path) -> None:
    inner = InnerConfig(model=f"{broken}:valid")
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = build(SMALL, inner, 7), build(SMALL, inner, 7), build(SMALL, inner, 8)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(a.head.weight, b.head.weight) and not torch.equal(a.head.weight, c.head.weight)
    same = build(SMALL, InnerConfig(), 7)
    assert all(torch.equal(p, q) for p, q in zip(same.parameters(), build_model(SMALL, 7).parameters(), strict=True))


def test_outputs_are_read_as_a_scalar_an_object_with_loss_or_with_ce() -> None:
    loss, ce = torch.tensor(2.0), torch.tensor(1.5)
    with_ce = type("Out", (), {"loss": loss, "ce": ce})()
    only_loss = type("Out", (), {"loss": loss})()
    assert training_loss(loss) is loss and quality_loss(loss) is loss
    assert training_loss(with_ce) is loss and quality_loss(with_ce) is ce
    assert quality_loss(only_loss) is loss


def test_ship_copies_a_file_and_rewrites_its_spec(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    assert ship(TINY_RNN, job_dir) == "tiny_rnn:build"
    assert (job_dir / MODEL_DIR / "tiny_rnn.py").read_text() == (EXAMPLES / "tiny_rnn.py").read_text()
    assert ship("tiny_rnn:build", job_dir) == "tiny_rnn:build"  # shipped already: nothing to find on this machine
    assert ship("", job_dir) == ""
    assert ship("ddctl_agents.train.model:build_model", job_dir) == "ddctl_agents.train.model:build_model"
    assert sorted(p.name for p in (job_dir / MODEL_DIR).iterdir()) == ["tiny_rnn.py"]


def test_ship_copies_an_importable_package_source_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "src" / "my_lm_pkg"
    (package / "nets" / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets" / "__init__.py").write_text("")
    (package / "nets" / "rnn.py").write_text((EXAMPLES / "tiny_rnn.py").read_text())
    (package / "nets" / "__pycache__" / "rnn.cpython-311.pyc").write_bytes(b"\0")
    (package / "README.md").write_text("not source")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    job_dir = tmp_path / "job"
    assert ship("my_lm_pkg.nets.rnn:build", job_dir) == "my_lm_pkg.nets.rnn:build"
    assert sorted(pack(job_dir / MODEL_DIR)) == ["my_lm_pkg/__init__.py", "my_lm_pkg/nets/__init__.py", "my_lm_pkg/nets/rnn.py"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [("json:loads", "shadow json"), ("no_such_module_anywhere:f", "no module"), ("math:sqrt", "not Python source")],
)
def test_ship_refuses_what_cannot_travel(tmp_path: Path, spec: str, says: str) -> None:
    with pytest.raises(ContractError, match=says):
        ship(spec, tmp_path / "job")


def test_shipped_files_unpack_where_a_learner_imports_them(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    spec = ship(TINY_RNN, job_dir)
    files = pack(job_dir / MODEL_DIR)
    where = unpack(files, tmp_path / "learner")
    assert where is not None and where.name == f"ddctl-model-{digest(files)[:16]}"
    assert unpack(files, tmp_path / "learner") == where  # a second rank finds it there
    assert unpack({}, tmp_path) is None and pack(None) == {} and pack(tmp_path / "absent") == {}
    sys.modules.pop("tiny_rnn", None)
    model = build(SMALL, InnerConfig(model=spec), 0, where)
    assert Path(sys.modules["tiny_rnn"].__file__ or "").parent == where
    reference = build(SMALL, InnerConfig(model=TINY_RNN), 0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))


@pytest.mark.parametrize("name", ["../evil.py", "/etc/evil.py", "notes.txt", "a\\b.py"])
def test_unpack_refuses_paths_outside_its_folder(tmp_path: Path, name: str) -> None:
    with pytest.raises(ContractError, match="relative paths of .py files"):
        unpack({name: "x = 1\n"}, tmp_path)


def test_a_search_folder_wins_over_a_module_imported_from_elsewhere(tmp_path: Path) -> None:
    for where, width in (("one", 8), ("two", 16)):
        (tmp_path / where).mkdir()
        (tmp_path / where / "shadowed_lm.py").write_text(f"WIDTH = {width}\ndef build(config):\n    return WIDTH\n")
    assert load_factory("shadowed_lm:build", tmp_path / "one")(SMALL) == 8
    assert load_factory("shadowed_lm:build", tmp_path / "two")(SMALL) == 16
    assert load_factory("shadowed_lm:build", tmp_path / "one")(SMALL) == 8


def custom_run(spec: str, tokens: int = 20_000) -> dict[str, object]:
    config = small_run(tokens=tokens)
    return train_decoupled(dataclasses.replace(config, inner=dataclasses.replace(config.inner, model=spec)))


@pytest.mark.parametrize("spec", [TINY_RNN, HF_MODEL], ids=["tiny_rnn", "hf_model"])
def test_a_model_of_your_own_trains_on_the_virtual_cluster(spec: str) -> None:
    config = small_run(tokens=20_000)
    assembly = Assembly.build(dataclasses.replace(config, inner=dataclasses.replace(config.inner, model=spec)))
    untrained = assembly.evaluate(assembly.initial)
    run = custom_run(spec)
    losses = [loss for _, loss in run["loss_curve"]]  # type: ignore[attr-defined]
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert math.isfinite(run["val_bpb"]) and run["val_bpb"] < untrained - 0.5  # type: ignore[operator]
    assert run["rounds"] > 0 and run["ledger"]["balanced"], run["ledger"]  # type: ignore[index]
    assert assembly.flops_per_token() == 6 * run["params"]  # type: ignore[operator]


@pytest.mark.slow
def test_a_shipped_model_trains_through_the_real_syncer_and_learners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The laptop ships the file into the job directory; the syncer imports it there, learners get it with the job."""
    from tests.service_harness import ENV, Job, small_job

    base = small_job(learners=2, tokens=40_000)
    spec = ship(TINY_RNN, tmp_path / "job")  # what the laptop does as it makes the job directory
    job = Job.create(tmp_path, dataclasses.replace(base, inner=dataclasses.replace(base.inner, model=spec)))
    monkeypatch.setitem(ENV, "TMPDIR", str(tmp_path / "learners-tmp"))  # where learners unpack the model
    (tmp_path / "learners-tmp").mkdir()
    try:
        job.start_syncer("--eval-every", "1")
        client = job.client("L0")
        try:
            assert sorted(client.job()["model_files"]) == ["tiny_rnn.py"]
        finally:
            client.close()
        job.start_learner("L0", "--gpus", "2")  # two CPU ranks: the leader hands the files to the other
        job.start_learner("L1")
        job.wait_learners()
        status = job.wait_for(lambda s: s["val_bpb"] and s["ledger"]["pending"] == 0, 60, "a final evaluation")
    finally:
        job.stop_all()
    assert all(job.summary(name)["reason"] == "finished" for name in ("L0", "L1"))
    assert status["ledger"]["balanced"] and math.isfinite(status["val_bpb"][-1][2])
    unpacked = [p.name for p in (tmp_path / "learners-tmp").glob("ddctl-model-*")]
    assert unpacked == [f"ddctl-model-{digest(pack(job.job_dir / MODEL_DIR))[:16]}"]  # one folder for all three ranks


def test_ddctl_train_takes_a_model_and_checks_it_first(broken: Path) -> None:
    from typer.testing import CliRunner

    from ddctl.cli.app import app

    small = ["--tokens", "16000", "--learners", "2", "--fragments", "4", "--batch-size", "4", "--max-bytes", str(1 << 20)]
    trained = CliRunner().invoke(app, ["train", *small, "--model", TINY_RNN, "--json"])
    assert trained.exit_code == 0, trained.output
    assert math.isfinite(json.loads(trained.stdout)["val_bpb"])
    refused = CliRunner().invoke(app, ["train", *small, "--fragments", "2", "--model", f"{broken}:dropout"])
    assert refused.exit_code == 2 and "rule 'determinism'" in refused.stderr, refused.output

from __future__ import annotations

import pytest
import torch

from ddctl_agents.core.config import OuterConfig
from ddctl_agents.core.merge import MergeError
from ddctl_agents.core.outer import outer_step
from ddctl_agents.errors import ConfigError


def test_nesterov_golden_values() -> None:
    cfg = OuterConfig(lr=0.7, momentum=0.9)
    theta, buf = {"w": torch.tensor([1.0, -2.0])}, {}
    theta, buf = outer_step(theta, {"w": torch.tensor([0.1, 0.2])}, buf, cfg)
    # buf = d = [.1,.2]; step = d + .9 buf = [.19,.38]; theta = [1,-2] - .7*step
    assert torch.allclose(theta["w"], torch.tensor([1 - 0.133, -2 - 0.266]))
    theta, buf = outer_step(theta, {"w": torch.tensor([0.1, 0.0])}, buf, cfg)
    # buf = .9*[.1,.2] + [.1,0] = [.19,.18]; step = [.1,0] + .9*buf = [.271,.162]
    assert torch.allclose(buf["w"], torch.tensor([0.19, 0.18]))
    assert torch.allclose(theta["w"], torch.tensor([0.867 - 0.7 * 0.271, -2.266 - 0.7 * 0.162]))


def test_matches_torch_sgd_with_nesterov() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter(torch.randn(50, generator=gen))
    opt = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    theta, buf = {"w": p.detach().clone()}, {}
    for _ in range(5):
        d = torch.randn(50, generator=gen)
        p.grad = d.clone()
        opt.step()
        theta, buf = outer_step(theta, {"w": d}, buf, OuterConfig(lr=0.7, momentum=0.9))
    assert torch.allclose(theta["w"], p.detach(), atol=1e-6)


def test_is_pure() -> None:
    theta, d = {"w": torch.ones(3)}, {"w": torch.ones(3)}
    buf = {"w": torch.ones(3)}
    outer_step(theta, d, buf, OuterConfig())
    assert torch.equal(theta["w"], torch.ones(3)) and torch.equal(buf["w"], torch.ones(3))


def test_mismatched_names_are_refused() -> None:
    with pytest.raises(MergeError, match="do not match"):
        outer_step({"a": torch.ones(1)}, {"b": torch.ones(1)}, {}, OuterConfig())


@pytest.mark.parametrize(("lr", "momentum"), [(0.0, 0.9), (0.7, 1.0), (0.7, -0.1)])
def test_bad_hyperparameters_are_refused(lr: float, momentum: float) -> None:
    with pytest.raises(ConfigError, match="outer"):
        OuterConfig(lr=lr, momentum=momentum)


def test_warmup_ramps_each_fragments_lr_linearly_then_holds() -> None:
    cfg = OuterConfig(lr=0.6, momentum=0.5, warmup=3)
    assert [cfg.lr_at(v) for v in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.6, 0.6])
    assert [OuterConfig(lr=0.6).lr_at(v) for v in (0, 9)] == [0.6, 0.6]  # 0: no warm-up
    theta, d = {"w": torch.zeros(2)}, {"w": torch.ones(2)}
    warm, _ = outer_step(theta, d, {}, cfg, taken=0)
    plain, _ = outer_step(theta, d, {}, OuterConfig(lr=0.2, momentum=0.5))
    assert torch.equal(warm["w"], plain["w"])  # the first step is the plain step at lr / 3
    assert torch.allclose(outer_step(theta, d, {}, cfg, taken=7)[0]["w"], torch.full((2,), -0.6 * 1.5))


def test_warmup_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="outer warmup must be an integer in 0..1000000"):
        OuterConfig(warmup=-1)


def test_the_syncer_warms_up_each_fragment_by_its_own_version() -> None:
    from builders import small_syncer, update_for

    s = small_syncer(outer=OuterConfig(lr=0.7, momentum=0.5, warmup=2))
    s.register(0.0, "L0")
    s.receive(1.0, update_for(s, "L0", 0))
    s.poll(1.0)
    name = next(iter(s.fragments[0]))
    # delta 1 on a fresh buffer: theta = 0 - lr * (1 + 0.5), at lr 0.7 / 2 for the fragment's first step
    assert torch.allclose(s.fragments[0][name], torch.full((4,), -0.35 * 1.5))
    assert s.versions == [1, 0]  # fragment 1 has taken no step: its first will be at lr / 2 too


def test_the_warmup_is_a_job_knob() -> None:
    from ddctl.config.job import build_job

    assert build_job({"outer_warmup": 5}).syncer.outer.warmup == 5
    with pytest.raises(ConfigError, match="outer warmup must be an integer in 0..1000000"):
        build_job({"outer_warmup": -2})


def test_max_behind_is_a_job_knob_and_the_cli_refuses_a_negative_one() -> None:
    from typer.testing import CliRunner

    from ddctl.cli.app import app
    from ddctl.config.job import build_job

    assert build_job({}).syncer.max_behind == 0 and build_job({"max_behind": 1}).syncer.max_behind == 1
    with pytest.raises(ConfigError, match="max_behind must be >= 0, got -1"):
        build_job({"max_behind": -1})
    refused = CliRunner().invoke(app, ["train", "--tokens", "1000", "--max-behind", "-1"])
    assert refused.exit_code == 2 and "max_behind must be >= 0, got -1" in refused.output

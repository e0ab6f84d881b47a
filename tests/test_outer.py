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

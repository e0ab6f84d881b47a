from __future__ import annotations

import pytest
import torch

from builders import small_run
from ddctl_agents.core.messages import FragmentVersion
from ddctl_agents.train.assembly import Assembly
from ddctl_agents.train.learner import Learner


@pytest.fixture(scope="module")
def assembly() -> Assembly:
    return Assembly.build(small_run())


def bootstrapped(a: Assembly, **kw: object) -> Learner:
    learner = a.new_learner(0, **kw)  # type: ignore[arg-type]
    syncer = a.new_syncer()
    for p in range(a.fragmentation.count):
        assert learner.on_arrival(syncer.fragment_message(p)) is None
    assert learner.ready
    return learner


def test_counters_follow_steps_and_tokens(assembly: Assembly) -> None:
    learner = bootstrapped(assembly)
    for _ in range(3):
        learner.train_step()
    tokens = 3 * learner.tokens_per_step
    assert all((s.c_steps, s.c_tokens) == (3, tokens) for s in learner.state)
    assert learner.ledger.trained == tokens * assembly.fragmentation.count


def test_outer_gradient_is_reference_minus_current_and_resets_counters(assembly: Assembly) -> None:
    learner = bootstrapped(assembly)
    start = {k: v.detach().clone() for k, v in learner.params.items()}
    learner.train_step()
    learner.train_step()
    update = learner.make_update(1)
    assert (update.fragment, update.base_version, update.c_steps, update.step) == (1, 0, 2, 2)
    for name, delta in update.tensors.items():
        assert torch.equal(delta, start[name] - learner.params[name].detach())
    assert learner.state[1].c_steps == 0 and learner.state[0].c_steps == 2
    assert update.adoptions == tuple((p, 0, 0) for p in range(assembly.fragmentation.count))
    learner.train_step()
    second = learner.make_update(1)  # a second send before any answer carries only the new drift
    assert second.c_steps == 1 and second.adoptions == ()


def test_adoption_overwrites_and_ignores_stale_versions(assembly: Assembly) -> None:
    learner = bootstrapped(assembly)
    learner.train_step()
    learner.make_update(0)
    learner.train_step()
    frag = assembly.fragmentation.fragments[0]
    values = {t.name: torch.full(t.shape, 0.5) for t in frag}
    assert learner.on_arrival(FragmentVersion(fragment=0, version=1, tensors=values)) is None  # it already sent: plain overwrite
    assert all(torch.equal(learner.params[t.name].detach(), values[t.name]) for t in frag)
    assert learner.state[0].version == 1 and learner.state[0].c_steps == 0
    assert learner.ledger.overwritten == learner.tokens_per_step  # the step in flight is discarded
    assert not learner.adopt(FragmentVersion(fragment=0, version=1, tensors=values))


def test_drift_no_round_has_seen_is_pushed_before_overwrite() -> None:
    assembly = Assembly.build(small_run(push_before_overwrite=True))
    learner = bootstrapped(assembly)
    learner.train_step()
    frag = assembly.fragmentation.fragments[2]
    values = {t.name: torch.zeros(t.shape) for t in frag}
    pushed = learner.on_arrival(FragmentVersion(fragment=2, version=1, tensors=values))
    assert pushed is not None and pushed.base_version == 0 and pushed.c_steps == 1
    assert learner.ledger.overwritten == 0


def test_plain_overwrite_by_default(assembly: Assembly) -> None:
    a = assembly
    learner = bootstrapped(a)
    learner.train_step()
    frag = a.fragmentation.fragments[2]
    assert (
        learner.on_arrival(FragmentVersion(fragment=2, version=1, tensors={t.name: torch.zeros(t.shape) for t in frag})) is None
    )
    assert learner.ledger.overwritten == learner.tokens_per_step


def test_error_feedback_keeps_the_quantisation_residual() -> None:
    learner = bootstrapped(Assembly.build(small_run(error_feedback=True)))
    learner.train_step()
    update = learner.make_update(0)
    residual = learner.state[0].residual
    assert residual and all(float(r.abs().max()) > 0 for r in residual.values())
    assert set(residual) == set(update.tensors)


def test_sending_without_drift_is_a_bug(assembly: Assembly) -> None:
    learner = bootstrapped(assembly)
    with pytest.raises(RuntimeError, match="no drift"):
        learner.make_update(0)


def test_first_sends_are_staggered_then_due_h_minus_1_after_adoption(assembly: Assembly) -> None:
    learner = bootstrapped(assembly)
    h, p_count = assembly.config.sync.inner_steps, assembly.fragmentation.count
    firsts = sorted(learner.due_steps())
    assert firsts == [h - p * h // p_count for p in reversed(range(p_count))]  # bootstrap keeps the stagger
    while 0 not in learner.due():
        learner.train_step()
    sent_at = learner.step
    learner.make_update(0)
    assert learner.due_steps()[0] == sent_at + h  # no answer: send again after H steps
    learner.train_step()
    frag = assembly.fragmentation.fragments[0]
    learner.on_arrival(FragmentVersion(fragment=0, version=1, tensors={t.name: torch.zeros(t.shape) for t in frag}))
    assert learner.due_steps()[0] == sent_at + h  # adopted one step later: period H


def test_a_version_from_a_missed_round_realigns_the_schedule(assembly: Assembly) -> None:
    learner = bootstrapped(assembly)
    h = assembly.config.sync.inner_steps
    learner.train_step()
    frag = assembly.fragmentation.fragments[1]
    learner.on_arrival(FragmentVersion(fragment=1, version=1, tensors={t.name: torch.zeros(t.shape) for t in frag}))
    assert learner.due_steps()[1] == 1 + h - 1  # aligned with the learners whose round this was

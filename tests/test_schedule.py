from __future__ import annotations

from ddctl_agents.core.schedule import due_after_adoption, is_due, next_due_step


def test_each_fragment_is_sent_once_every_h_steps_staggered_evenly() -> None:
    fragments, h = 4, 8
    sends = {p: [t for t in range(1, 33) if is_due(t, p, fragments, h)] for p in range(fragments)}
    for times in sends.values():
        assert len(times) == 4 and all(b - a == h for a, b in zip(times, times[1:], strict=False))
    firsts = sorted(times[0] for times in sends.values())
    assert firsts == [2, 4, 6, 8]  # one fragment every H/P steps, the first after >= H/P steps


def test_paper_default_sends_one_fragment_every_step() -> None:
    assert all(sum(is_due(t, p, 24, 24) for p in range(24)) == 1 for t in range(1, 100))


def test_after_adoption_the_period_stays_h_in_the_normal_flow() -> None:
    sent_after, adopted_after = 24, 25  # the answer lands during the next step
    assert due_after_adoption(adopted_after, 24) == sent_after + 24


def test_next_due_step_agrees_with_is_due() -> None:
    for p in range(3):
        for after in range(0, 30):
            nxt = next_due_step(after, p, 3, 7)
            assert nxt > after and is_due(nxt, p, 3, 7)
            assert not any(is_due(t, p, 3, 7) for t in range(after + 1, nxt))

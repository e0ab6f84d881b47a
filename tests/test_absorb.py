"""A queued, unsent update absorbs the same fragment's newer drift: one upload, the same round."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ddctl_agents.agent.comm import Comms, Identity
from ddctl_agents.agent.routes import Routes
from ddctl_agents.core.messages import Update, absorb, decode_update, encode_update
from ddctl_agents.core.wire import pack
from ddctl_agents.errors import WireError
from tests.builders import small_syncer, update_for


def comms(absorbing: bool = True) -> Comms:
    never = Routes({"": "http://127.0.0.1:9"})
    return Comms(lambda url: None, never, Identity(name="L0", incarnation=1, region="r"), "fp32", 64, absorb=absorbing)  # type: ignore[arg-type,return-value]


def drift(fragment: int = 0, base: int = 0, value: float = 1.0, number: int = 1, c_steps: int = 4) -> Update:
    tensors = {"a": torch.full((4,), value), "b": torch.full((4,), -value)}
    return Update(learner="L0", fragment=fragment, base_version=base, update_id=f"L0.1.{number}", step=4 * number,
                  c_steps=c_steps, c_tokens=100 * c_steps, tensors=tensors, vclock={"L0": number},
                  adoptions=((1, 3, 4 * number),))  # fmt: skip


def test_absorb_adds_the_drifts_and_the_counters_and_keeps_the_newer_identity() -> None:
    both = absorb(drift(value=1.0, number=1, c_steps=4), drift(value=0.5, number=2, c_steps=3))
    assert torch.equal(both.tensors["a"], torch.full((4,), 1.5)) and torch.equal(both.tensors["b"], torch.full((4,), -1.5))
    assert (both.c_steps, both.c_tokens, both.step, both.update_id) == (7, 700, 8, "L0.1.2")
    assert both.vclock == {"L0": 2} and both.adoptions == ((1, 3, 4), (1, 3, 8))
    assert both.absorbed == (("L0.1.1", 4, 1),)  # what a replay needs to make the older one again
    three = absorb(both, drift(value=0.25, number=3, c_steps=2))
    assert three.absorbed == (("L0.1.1", 4, 1), ("L0.1.2", 8, 1)) and three.adoptions == ((1, 3, 4), (1, 3, 8), (1, 3, 12))
    for other in (drift(fragment=1, number=2), drift(base=1, number=2), replace(drift(number=2), learner="L1")):
        with pytest.raises(ValueError, match="only one learner's updates of one fragment from one base"):
            absorb(drift(), other)


def test_a_queued_update_absorbs_the_newer_one_of_its_fragment_and_base_only() -> None:
    c = comms()
    c.send(drift(fragment=0, number=1))
    c.send(drift(fragment=1, number=2))
    c.send(drift(fragment=0, number=3))  # absorbed into the first
    c.send(drift(fragment=0, base=1, number=4))  # a newer base: its own upload
    queued = list(c.outbox.queue)
    assert [(u.fragment, u.base_version, u.update_id) for u in queued] == [(0, 0, "L0.1.3"), (1, 0, "L0.1.2"), (0, 1, "L0.1.4")]
    assert queued[0].c_tokens == 800 and torch.equal(queued[0].tensors["a"], torch.full((4,), 2.0))
    assert c.ledger.sent == 1600 and c.ledger.absorbed == 1 and c._busy == 3  # drain waits for three acks, not four


def test_without_absorbing_every_update_is_its_own_upload() -> None:
    c = comms(absorbing=False)
    for n in (1, 2):
        c.send(drift(number=n))
    assert c.outbox.qsize() == 2 and c.ledger.absorbed == 0 and c._busy == 2


def test_the_syncer_merges_an_absorbed_update_as_it_merges_the_two() -> None:
    separate, together = small_syncer(), small_syncer()
    for s in (separate, together):
        s.register(0.0, "L0")
        s.register(0.0, "L1")
    first = update_for(separate, "L0", 0, value=0.01)
    second = replace(update_for(separate, "L0", 0, value=0.02), step=8)  # trained after the first: steps 5-8
    other = update_for(separate, "L1", 0, value=0.03)
    for u in (first, second, other):
        assert separate.receive(1.0, u)[0].status == "accepted"
    for u in (absorb(first, second), other):
        assert together.receive(1.0, u)[0].status == "accepted"
    separate.close_round(2.0, 0, "test", "test")
    together.close_round(2.0, 0, "test", "test")
    for name, tensor in separate.fragments[0].items():
        assert torch.allclose(tensor, together.fragments[0][name], atol=1e-7), name
    assert separate.ledger.merged == together.ledger.merged == 1200


def test_what_an_update_absorbed_crosses_the_wire_and_a_plain_update_says_nothing_of_it() -> None:
    both = absorb(drift(number=1), drift(number=2))
    decoded, _ = decode_update(encode_update(both, "fp32", 64))
    assert decoded.absorbed == (("L0.1.1", 4, 1),) and decoded.adoptions == both.adoptions
    plain = encode_update(drift(number=1), "fp32", 64)
    assert b"absorbed" not in plain and decode_update(plain)[0].absorbed == ()


@pytest.mark.parametrize(
    ("absorbed", "needle"),
    [
        ("L0.1.1", "must be a list"),
        ([["L0.1.1", 4]], "bad entry"),
        ([["L0.1.1", -1, 0]], "bad entry"),
        ([[7, 4, 0]], "'absorbed' update id must be 1-128 printable ASCII"),
        ([["L0.1.\u00e9", 4, 0]], "1-128 printable ASCII"),
        ([["L0.1.1", 9, 0]], "made after this one"),  # the update is step 8
        ([["L0.1.1", 4, 2]], "more adoptions than its 1"),
        ([["L0.1.1", 4, 0], ["L0.1.1", 6, 0]], "names an update twice"),
        ([["L0.1.2", 4, 0]], "names an update twice, or this update itself"),
    ],
)
def test_a_bad_absorbed_field_is_refused_naming_it(absorbed: object, needle: str) -> None:
    """Whatever a learner says it absorbed is checked in type, range and shape before a tape records it."""
    update = drift(number=2)
    with pytest.raises(WireError, match=needle):
        decode_update(pack("update", update.meta() | {"absorbed": absorbed}, update.tensors, "fp32", 64))

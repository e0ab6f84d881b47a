"""What a learner's uploader does with a synchronizer's acknowledgement: only a status the synchronizer can give is
counted; any other answer sends the update again (a copy that arrived is a duplicate there), and no answer or
local error ends the uploader thread with the update lost and ``drain`` waiting for ever (found by an audit of
what a learner takes from a shard)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ddctl_agents.agent.comm import Comms, Identity
from ddctl_agents.agent.routes import Routes
from ddctl_agents.core.effects import ACK_STATUSES
from ddctl_agents.core.messages import Update
from ddctl_agents.errors import Unavailable


def comms(block: int = 64) -> Comms:
    never = Routes({"": "http://127.0.0.1:9"})
    return Comms(lambda url: None, never, Identity(name="L0", incarnation=1, region="r"), "fp32", block)  # type: ignore[arg-type,return-value]


def update(number: int = 1) -> Update:
    return Update(learner="L0", fragment=0, base_version=0, update_id=f"L0.1.{number}", step=4, c_steps=4, c_tokens=400,
                  tensors={"a": torch.ones(8)}, vclock={"L0": number}, adoptions=())  # fmt: skip


def answering(*answers: dict[str, Any]) -> tuple[list[int], Any]:
    calls: list[int] = []

    def push(frame: bytes, fragment: int) -> dict[str, Any]:
        calls.append(fragment)
        return answers[min(len(calls), len(answers)) - 1]

    return calls, push


@pytest.mark.parametrize("answer", [{}, {"ok": True}, {"status": "x" * 10_000}, {"status": ["accepted"]}])
def test_an_ack_without_a_known_status_sends_the_update_again(answer: dict[str, Any]) -> None:
    c = comms()
    calls, push = answering(answer, answer, {"status": "duplicate", "reason": "", "version": 1})
    c.send(update())
    c._upload_next(push)
    assert len(calls) == 3 and c.ledger.acked == {"duplicate": 400} and c.ledger.rejected == 0
    assert c.drain(0.1) and c.outbox.empty()


def test_an_unexpected_error_counts_the_update_refused_and_the_uploader_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """A block the codec cannot use (from a job answer) ended the thread at its first encode, ``_busy`` stuck at 1."""
    c = comms(block=7)
    _, push = answering({"status": "accepted", "reason": "", "version": 1})
    c.send(update())
    c._upload_next(push)
    assert c.ledger.rejected == 400 and c.ledger.acked == {} and c.drain(0.1)
    assert any("update L0.1.1 could not be sent: counted as refused" in m for m in caplog.messages)


def test_every_status_the_synchronizer_gives_is_counted_as_it_says() -> None:
    for status in ACK_STATUSES:
        c = comms()
        _, push = answering({"status": status, "reason": "", "version": 1})
        c.send(update())
        c._upload_next(push)
        assert c.ledger.acked == {status: 400} and c.drain(0.1)
    with pytest.raises(Unavailable, match=r"update L0\.1\.1 answered with status 'xxxx.*, not one of accepted, late"):
        from ddctl_agents.agent.comm import acknowledged

        acknowledged(answering({"status": "x" * 500})[1], b"", update())


class _Recording:
    """A client that says what each push named as the history of its base versions."""

    def __init__(self) -> None:
        self.named: list[str] = []

    def push(self, frame: bytes, fragment: int, based_in: str = "") -> dict[str, Any]:
        self.named.append(based_in)
        return {"status": "accepted", "reason": "", "version": 1}


def test_an_update_names_the_history_its_shards_stream_named() -> None:
    """A syncer that started over refuses an update of the old history even where its base number is one the new
    history also has (the content under it is not the same): it can only if the update says which it is of."""
    c, client, url = comms(), _Recording(), "http://127.0.0.1:9"
    c._push(client, url, b"", 0)  # type: ignore[arg-type]  # its stream has not opened: none to name
    c.subscriber._opened(url, "0123456789abcdef")
    c._push(client, url, b"", 0)  # type: ignore[arg-type]
    c._push(client, "http://127.0.0.1:10", b"", 0)  # type: ignore[arg-type]  # another shard's stream named none
    assert client.named == ["", "0123456789abcdef", ""]

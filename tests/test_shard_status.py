"""``ddctl syncer status``'s figures: the shards' books added up, learners' figures never double counted."""

from __future__ import annotations

from typing import Any

import pytest

from ddctl.control.shard_status import gather, readable, summarize
from ddctl_agents.errors import Unavailable


def status(name: str, epoch: int, owned: list[int], versions: list[int], received: int, trained: int) -> dict[str, Any]:
    books = {"received": received, "merged": received - 10, "late_merged": 0, "dropped": 0, "rejected": 0, "pending": 10}
    tokens = {k: v // 4 for k, v in books.items()} | {"budget": 1000, "planned": 990, "trained": trained}
    return {
        "shard": {"name": name, "epoch": epoch, "shards": ["S0", "S1", "S2"], "owned": owned},
        "fragments": 4, "versions": versions, "rounds": sum(versions), "live": ["L0", "L1"] if name == "S0" else ["L1"],
        "ledger": {**books, "balanced": True}, "tokens": tokens, "job": {"phase": "training"},
    }  # fmt: skip


def test_the_job_adds_up_books_and_takes_each_fragments_version_from_its_newest_owner() -> None:
    answers = [
        ("https://a", status("S0", 2, [0, 1, 2], [5, 4, 6, 0], received=400, trained=700), ""),
        ("https://b", status("S1", 2, [3], [0, 3, 0, 7], received=100, trained=650), ""),  # 3 was S1's before epoch 2
        ("https://c", None, "GET /v1/status: connection refused"),
    ]
    out = summarize(answers)
    job = out["job"]
    assert job["partial"] is True and (job["shards"], job["reachable"]) == (3, 2)
    assert job["ledger"] == {"received": 500, "merged": 480, "late_merged": 0, "dropped": 0, "rejected": 0, "pending": 20}
    assert job["tokens"]["received"] == 125 and job["tokens"]["trained"] == 700 and job["tokens"]["budget"] == 1000
    assert job["versions"] == [5, 4, 6, 7] and job["epoch"] == 2 and job["rounds"] == 15 + 10
    assert job["live"] == ["L0", "L1"] and job["balanced"] is True
    assert [r["reachable"] for r in out["shards"]] == [True, True, False]
    assert out["shards"][1]["versions"] == {3: 7} and "connection refused" in out["shards"][2]["error"]


def test_an_older_claim_loses_to_a_newer_epoch() -> None:
    stale = status("S1", 1, [1, 3], [0, 9, 0, 7], received=100, trained=10)  # S1 before it handed 1 out
    fresh = status("S0", 2, [0, 1, 2], [5, 4, 6, 0], received=400, trained=10)
    assert summarize([("a", stale, ""), ("b", fresh, "")])["job"]["versions"] == [5, 4, 6, 7]


def mapped(name: str, epoch: int, owned: list[int], versions: list[int], owners: Any) -> dict[str, Any]:
    answer = status(name, epoch, owned, versions, received=10, trained=10)
    return answer | {"shard": {**answer["shard"], "owners": owners}}


def test_a_fragment_whose_owner_did_not_answer_is_unheard_where_one_in_a_handoff_is_not() -> None:
    """S1 handed fragment 1 to S0 (S1's map is at epoch 2; S0 has not taken it in), and S2, owner of 3, is down."""
    s0 = status("S0", 1, [0], [5, 0, 0, 0], received=10, trained=10)  # a shard that serves no owners: no help
    s1 = mapped("S1", 2, [2], [0, 4, 6, 0], [0, 0, 1, 2])
    job = summarize([("a", s0, ""), ("b", s1, ""), ("c", None, "connection refused")])["job"]
    assert job["unheard"] == [3] and job["handoff"] == [1]  # 1 is S0's, which answered: handed out, not yet taken in
    assert job["versions"] == [5, 4, 6, None]  # 1: the version S1 handed out (S0's own copy is 0)
    assert summarize([("a", s0, ""), ("b", None, "refused"), ("c", None, "refused")])["job"]["unheard"] == []
    s0_mapped = mapped("S0", 1, [0], [5, 0, 0, 0], [0, 1, 1, 2])  # epoch 1: S1 owns 1 and 2
    job = summarize([("a", s0_mapped, ""), ("b", None, "refused"), ("c", None, "refused")])["job"]
    assert job["unheard"] == [1, 2, 3] and job["versions"] == [5, None, None, None] and job["handoff"] == []


def test_with_no_map_served_a_fragment_claimed_by_none_is_in_a_handoff_only_when_every_shard_answered() -> None:
    """Shards that serve no owners: an unclaimed fragment's owner may be the shard that did not answer."""
    s0 = status("S0", 2, [0, 1], [5, 3, 0, 0], received=10, trained=10)
    s1 = status("S1", 1, [3], [0, 2, 0, 7], received=10, trained=10)  # 1 is S0's now; 2 is S2's
    s2 = status("S2", 1, [], [0, 0, 8, 0], received=10, trained=10)  # handed 2 out, its taker not yet in
    job = summarize([("a", s0, ""), ("b", s1, ""), ("c", s2, "")])["job"]
    assert job["handoff"] == [2] and job["unheard"] == [] and job["versions"] == [5, 3, 8, 7]
    job = summarize([("a", s0, ""), ("b", s1, ""), ("c", None, "connection refused")])["job"]
    assert job["handoff"] == [] and job["unheard"] == [] and job["versions"] == [5, 3, None, 7]  # 2: S2 may own it


@pytest.mark.parametrize(
    "owners",
    [[0, 0, 1], [0, 0, 1, 2, 0], [0, 0, 1, 3], [0, 0, 1, -1], [0, False, 1, 2], [0, 0, 1, "2"], [0, 0, 1, 2.0],
     [0, 0, 1, None], {"3": 2}, "0012", None, [0, 0, 1, 2**64], [0] * 100_000],
)  # fmt: skip
def test_a_map_that_is_not_one_tells_nothing_and_the_status_still_counts(owners: Any) -> None:
    s0 = status("S0", 1, [0], [5, 0, 0, 0], received=10, trained=10)
    s1 = mapped("S1", 2, [2], [0, 4, 6, 0], owners)
    readable(s1)  # the shard's figures are whole: its map alone is ignored
    out = summarize([("a", s0, ""), ("b", s1, ""), ("c", None, "connection refused")])
    assert out["job"]["unheard"] == [] and out["job"]["versions"] == [5, None, 6, None] and out["job"]["rounds"] == 15
    assert out["job"]["handoff"] == []  # with no map and a shard down, an unclaimed fragment's owner may be that shard


def test_each_shard_shows_its_own_site_reading_and_a_malformed_one_reads_as_not_measured() -> None:
    good = status("S0", 1, [0, 1], [1, 1, 0, 0], received=10, trained=10) | {
        "site": {"name": "h1", "up_mbps": 58.2, "down_mbps": 49.0}
    }
    odd = status("S1", 1, [2, 3], [0, 0, 1, 1], received=10, trained=10) | {
        "site": {"name": 7, "up_mbps": "fast", "down_mbps": True}
    }
    old = status("S2", 1, [], [0, 0, 0, 0], received=0, trained=10)  # a shard from before the site meter
    rows = summarize([("a", good, ""), ("b", odd, ""), ("c", old, "")])["shards"]
    assert rows[0]["site"] == {"name": "h1", "up_mbps": 58.2, "down_mbps": 49.0}
    assert rows[1]["site"] == rows[2]["site"] == {"name": "", "up_mbps": None, "down_mbps": None}


class Shard:
    """A shard's client that answers ``answer`` (an exception: raised), and notes that it was closed."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.closed = answer, False

    def status(self) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    "bad",
    [["not", "a", "status"], {"rounds": 3}, {"ledger": None}, {"versions": [1]}, {"shard": {"name": "S1", "owned": [9]}},
     {"tokens": {"merged": "x"}}, {"job": "finished"}, {"rounds": float("inf")}, {"versions": [float("inf")] * 4},
     {"tokens": {"trained": float("nan")}}, {"shard": {"name": "S1", "epoch": float("inf"), "owned": [2]}},
     {"versions": [0, 2**70, 1, 1]}, {"versions": [0, -1, 1, 1]}, {"versions": [0, True, 1, 1]},
     {"versions": [0, None, 1, 1]}, {"versions": [0, 0, 1, 1] * 25_000}, {"versions": "0011"}],
)  # fmt: skip
def test_a_shard_whose_status_is_malformed_is_listed_as_not_answering_and_the_job_reads_from_the_others(bad: Any) -> None:
    good = status("S0", 1, [0, 1], [1, 1, 0, 0], received=10, trained=10)
    odd = bad if isinstance(bad, list) or bad == {"rounds": 3} else {**status("S1", 1, [2, 3], [0, 0, 1, 1], 10, 10), **bad}
    clients = {"https://a": Shard(good), "https://b": Shard(odd), "https://c": Shard(Unavailable("connection refused"))}
    answers = gather(list(clients), clients.__getitem__)
    assert [a[0] for a in answers] == list(clients) and answers[0] == ("https://a", good, "")
    assert answers[1][1] is None and answers[1][2].startswith("its status is malformed (") and len(answers[1][2]) <= 301
    assert answers[2] == ("https://c", None, "connection refused") and all(c.closed for c in clients.values())
    job = summarize(answers)["job"]
    assert job["partial"] and job["reachable"] == 1 and job["rounds"] == 2 and job["versions"] == [1, 1, None, None]

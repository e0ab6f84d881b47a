"""``ddctl stop`` against the synchronizer's processes, fast: every shard is asked even when one does not answer,
the silent one is asked again while the command waits, and a wait that runs out says which shard never answered.
The real service's stop runs in ``test_job_end.py``; a stopped sharded run end to end in ``test_up_sharded.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ddctl.cli.errors import EXIT_UNREACHABLE, EXIT_USAGE, exit_code_for
from ddctl.control.finish import StopAsk, stop
from ddctl.control.rundir import RunDir
from ddctl.control.state import State
from ddctl.errors import DdctlError, UnreachableError
from ddctl_agents.errors import Unavailable

SHARDS = ["https://10.0.0.1:8443", "https://10.0.0.2:8443", "https://10.0.0.3:8443"]
SUMMARY = {"reason": "stopped by the operator", "rounds": 7}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> State:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    RunDir("r").root.mkdir(parents=True)
    RunDir("r").shard_urls.write_text("\n".join(SHARDS) + "\n")
    state = State()
    state.create_run("r", "regions.yaml", str(RunDir("r").job), {})
    return state


def shards(answers: dict[str, list[bool | None]], asked: list[str], then: Callable[[], None] = lambda: None) -> StopAsk:
    """An ask that answers each shard from its list in turn (None: unreachable), recording who was asked."""

    def ask(run: str, url: str, reason: str) -> bool:
        assert run == "r" and reason == "enough"
        asked.append(url)
        answer = answers[url].pop(0) if len(answers[url]) > 1 else answers[url][0]
        if answer is None:
            raise Unavailable(f"{url}: connection refused")
        then()
        return answer

    return ask


def finish(state: State) -> None:
    state.update_run_detail("r", {"summary": SUMMARY})
    state.set_run_state("r", "finished")


def test_every_shard_is_asked_and_the_result_is_the_controllers_record(state: State) -> None:
    asked: list[str] = []
    ask = shards({SHARDS[0]: [True], SHARDS[1]: [False], SHARDS[2]: [True]}, asked, then=lambda: finish(state))
    result = stop("r", state, "enough", timeout_s=5, ask=ask)
    assert asked == SHARDS  # each once: a shard that answered is not asked again
    assert result == {"run": "r", "stopping": True, "summary": SUMMARY}


def test_a_shard_that_does_not_answer_does_not_keep_the_others_from_stopping_and_is_asked_again(state: State) -> None:
    asked: list[str] = []
    answers: dict[str, list[bool | None]] = {SHARDS[0]: [None, None, True], SHARDS[1]: [True], SHARDS[2]: [True]}
    ask = shards(answers, asked, then=lambda: finish(state) if asked.count(SHARDS[0]) == 3 else None)
    result = stop("r", state, "enough", timeout_s=10, ask=ask)
    assert asked[:3] == SHARDS  # the first shard's silence did not stop the loop before the others
    assert asked.count(SHARDS[0]) == 3 and asked.count(SHARDS[1]) == asked.count(SHARDS[2]) == 1
    assert result["summary"] == SUMMARY and result["stopping"]


def test_a_wait_that_runs_out_names_the_shard_that_never_answered_and_exits_unreachable(state: State) -> None:
    asked: list[str] = []
    ask = shards({SHARDS[0]: [True], SHARDS[1]: [None], SHARDS[2]: [True]}, asked)
    with pytest.raises(UnreachableError) as caught:
        stop("r", state, "enough", timeout_s=1.2, ask=ask)
    message = str(caught.value)
    assert message.startswith("timed out after 1.2s waiting for r to finish") and SHARDS[1] in message
    assert SHARDS[0] not in message and SHARDS[2] not in message
    assert asked.count(SHARDS[1]) >= 2 and exit_code_for(caught.value) == EXIT_UNREACHABLE
    assert state.run("r") is not None and state.run("r").state != "finished"  # nothing recorded that did not happen


def test_a_wait_that_runs_out_after_every_shard_answered_says_so_and_is_no_crash(state: State) -> None:
    ask = shards({url: [True] for url in SHARDS}, [])
    with pytest.raises(DdctlError) as caught:
        stop("r", state, "enough", timeout_s=0.6, ask=ask)
    assert not isinstance(caught.value, UnreachableError) and exit_code_for(caught.value) == EXIT_USAGE
    assert "every synchronizer was asked to stop" in str(caught.value) and "ddctl status --run r" in str(caught.value)


ANSWERS = [
    ({"stopping": True}, True),
    ({"stopping": False}, False),
    ({"stopping": "yes"}, False),
    (["stopping"], False),
    (None, False),
]


@pytest.mark.parametrize(("answer", "stopping"), ANSWERS)
def test_a_shards_answer_to_the_stop_is_checked_and_the_client_closed(
    answer: object, stopping: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddctl.control import finish, up

    closed: list[bool] = []

    class Client:
        def stop_job(self, reason: str) -> object:
            assert reason == "enough"
            return answer

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(up, "admin_client", lambda run, url: Client())
    assert finish.ask_to_stop("r", SHARDS[0], "enough") is stopping and closed == [True]

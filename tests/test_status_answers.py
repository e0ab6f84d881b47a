"""What another process sends is checked before it is shown: a synchronizer's ``/v1/status`` (``ddctl status``,
``--watch``, ``ddctl syncer status``) and agents' log lines (``ddctl logs``). No answer crashes a command, ends the
live view, acts on the operator's terminal (escape sequences) or forges a line (newlines)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from ddctl.cli.app import app
from ddctl.control.state import InstanceRecord, State
from ddctl.dashboard import watch
from ddctl.dashboard.render import render
from ddctl.dashboard.snapshot import RunRecords, SyncerView, build, from_recording
from ddctl_agents.errors import Unavailable

DATA = Path(__file__).parent / "data" / "dashboard"
SHAPE = "the synchronizer answered a status of another shape"
L0 = InstanceRecord("r", "L0", "eu", "docker", "learner", "training", "c1", 0.0, {})
RECORDS = RunRecords(run="r", provider="docker", instances=[L0])


class FakeClient:
    url = "https://10.0.0.1:8443"

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def status(self) -> Any:
        return self.answer

    def close(self) -> None:
        pass


@pytest.fixture
def answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the (one, unsharded) synchronizer answers next: the test appends it."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    said: list[Any] = []
    monkeypatch.setattr(watch, "admin_client", lambda run, timeout_s=3.0: FakeClient(said[-1]))
    return said


def draw(view: SyncerView, records: RunRecords = RECORDS) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=200).print(render(build(records, view, 1001.0), 200, 60))
    return out.getvalue()


OTHER_SHAPES = {
    "learners is a string": {"learners": "x"},
    "learner row without id": {"learners": [{}]},
    "rounds is a string": {"rounds": "many"},
    "event without 'event'": {"events": [{"t": 1.0}]},
    "event t is a string": {"events": [{"t": "x", "event": "join"}, {"t": 1.0, "event": "join"}]},
    "event t = 1e20": {"events": [{"t": 1e20, "event": "join"}]},
    "bytes_up a string": {"bytes_up": "1"},
    "recent_rounds t a string": {"recent_rounds": [{"t": "a"}, {"t": "b"}]},
    "degraded not a list of dicts": {"degraded": [1]},
    "not an object": ["learners"],
    "nested too deep": {"job": json.loads("[" * 40 + "]" * 40)},
}


@pytest.mark.parametrize("status", OTHER_SHAPES.values(), ids=list(OTHER_SHAPES))
def test_a_status_of_another_shape_is_the_views_error_not_a_traceback(answers: list[Any], status: Any) -> None:
    answers.append(status)
    view = watch.ask_syncer("r")
    assert view.status is None and view.error is not None and view.error.startswith(SHAPE)
    screen = draw(view)
    assert SHAPE in screen and "L0" in screen
    # it answered: the header does not blame the network
    assert "syncer's answer unusable, no usable answer yet" in screen and "unreachable" not in screen
    assert build(RECORDS, view, 1001.0)["syncer"]["unusable"] is True


class Down(FakeClient):
    def status(self) -> Any:
        raise Unavailable("GET /v1/status: ConnectError('connection refused')")


def test_a_syncer_that_does_not_answer_is_unreachable_not_unusable(answers: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "admin_client", lambda run, timeout_s=3.0: Down(None))
    view = watch.ask_syncer("r")
    assert view.unusable is False and build(RECORDS, view, 1001.0)["syncer"]["unusable"] is False
    assert "syncer unreachable, never reached: GET /v1/status: ConnectError" in draw(view)


@pytest.mark.parametrize(
    ("answer", "code", "said"), [({"learners": "x"}, 3, "syncer's answer unusable"), (None, 6, "unreachable")]
)
def test_status_exits_3_for_an_answer_of_another_shape_and_6_for_none(
    answers: list[Any], monkeypatch: pytest.MonkeyPatch, answer: Any, code: int, said: str
) -> None:
    if answer is None:
        monkeypatch.setattr(watch, "admin_client", lambda run, timeout_s=3.0: Down(None))
    answers.append(answer)
    with State() as state:
        state.create_run("r", "regions.yaml", "")
        state.put_instance(L0)
    result = CliRunner().invoke(app, ["status", "--run", "r"])
    assert result.exit_code == code and said in result.stdout, result.output
    as_json = CliRunner().invoke(app, ["status", "--run", "r", "--json"])
    assert as_json.exit_code == code and json.loads(as_json.stdout)["syncer"]["unusable"] is (code == 3)


def test_json_nested_past_the_parsers_depth_is_the_views_error(answers: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    class Deep(FakeClient):
        def status(self) -> Any:
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    monkeypatch.setattr(watch, "admin_client", lambda run, timeout_s=3.0: Deep(None))
    view = watch.ask_syncer("r")
    assert view.status is None and view.error == f"{SHAPE}: nested too deep to read"


@pytest.mark.parametrize(
    "series", [[[1.0, float("nan")], [2.0, 1.0]], [[1.0, 10**400], [2.0, 1.0]], [[1.0, float("inf")], [2.0, 1.0]]]
)
def test_a_figure_that_is_not_one_is_dropped_from_a_series(answers: list[Any], series: list[list[float]]) -> None:
    answers.append({"val_bpb": series})
    view = watch.ask_syncer("r")
    assert view.error is None and view.status is not None
    assert view.status["val_bpb"] == [[2.0, 1.0]]
    assert "bpb 1.000" in draw(view)


@pytest.mark.parametrize("name", ["running_3.json", "running_16.json", "preempted.json"])
def test_a_valid_status_is_drawn_as_before(answers: list[Any], name: str) -> None:
    raw = json.loads((DATA / name).read_text())
    answers.append(raw["syncer"]["status"])
    view = watch.ask_syncer("r")
    assert view.error is None and view.status == raw["syncer"]["status"]
    assert from_recording(raw | {"syncer": raw["syncer"] | {"status": view.status}}) == from_recording(raw)


def test_escape_sequences_and_newlines_from_the_synchronizer_are_shown_escaped(answers: list[Any]) -> None:
    answers.append(
        {
            "learners": [{"id": "L0", "live": True, "accelerator": "H100\x1b]0;owned-title\x07\x1b[2J"}],
            "events": [{"t": 1000.0, "event": "leave", "learner": "L0", "reason": "ok\n12:00:00 L9 joined (forged)"}],
        }
    )
    screen = draw(watch.ask_syncer("r"))
    assert "\x1b]0;" not in screen and "\x1b[2J" not in screen and "\x07" not in screen
    assert "H100\\x1b]0;owned-title" in screen
    lines = [line for line in screen.splitlines() if "forged" in line]
    assert len(lines) == 1 and "ok\\n12:00:00 L9 joined (forged)" in lines[0]


def test_watch_goes_on_showing_the_error_when_the_synchronizer_answers_another_shape(
    answers: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    answers.append({"learners": "x"})

    class Records:
        def instances(self, run: str) -> list[InstanceRecord]:
            return [L0]

        def events(self, run: str, most: int) -> list[dict[str, Any]]:
            return []

    monkeypatch.setattr(watch, "run_records", lambda run, state: RECORDS)
    out = io.StringIO()
    watch.watch("r", Records(), Console(file=out, width=200), every_s=0.2, frames=2)  # type: ignore[arg-type]
    assert out.getvalue().count(SHAPE) == 2 and out.getvalue().count("syncer's answer unusable") == 2


def shard(name: str, site: str = "eu", **more: Any) -> dict[str, Any]:
    books = dict.fromkeys(("received", "merged", "late_merged", "dropped", "rejected", "pending"), 0)
    return {
        "shard": {"name": name, "epoch": 1, "owned": [0]},
        "versions": [3],
        "fragments": 1,
        "rounds": 5,
        "live": ["L0"],
        "ledger": books | {"balanced": True},
        "job": {"phase": "training"},
        "tokens": {"budget": 1, "planned": 1, "trained": 1},
        "site": {"name": site, "up_mbps": 10, "down_mbps": 10},
        **more,
    }


def test_a_sharded_synchronizers_answers_are_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    class Dir:
        def __init__(self, run: str) -> None:
            self.shard_urls = Path(__file__)  # a file: the run is sharded

        def urls(self) -> list[str]:
            return ["https://10.0.0.1:8443"]

    monkeypatch.setattr(watch, "RunDir", Dir)
    forged = {"t": 1000.0, "event": "leave", "learner": "L0", "reason": "ok\n12:00:00 L9 joined (forged)"}
    said = shard("S0\x1b[2J", events=[forged])
    monkeypatch.setattr(watch, "gather", lambda urls, connect: [(urls[0], said, "")])
    screen = draw(watch.ask_syncer("r"))
    assert "\x1b[2J" not in screen and "S0\\x1b[2J" in screen
    assert len([line for line in screen.splitlines() if "forged" in line]) == 1
    said["learners"] = "x"
    view = watch.ask_syncer("r")
    assert view.status is None and view.error is not None and view.error.startswith(SHAPE)


def test_syncer_status_shows_a_shards_names_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddctl.cli import output
    from ddctl.cli import syncer as cli
    from ddctl.control.shard_status import summarize

    out = io.StringIO()
    monkeypatch.setattr(output, "stdout", lambda: Console(file=out, force_terminal=True, width=250))
    said = [
        ("https://10.0.0.1:8443", shard("[link=https://evil.example/]S0[/link]", site="[blink red]eu"), ""),
        ("https://10.0.0.2:8443", shard("[/]", site="eu\x1b]0;owned\x07"), ""),
        ("https://10.0.0.3:8443", None, "[/] gone\x1b[2J"),
    ]
    cli._print_shards(summarize(said))
    text = out.getvalue()
    assert "\x1b]8;" not in text and "\x1b[5" not in text and "\x1b]0;" not in text and "\x1b[2J" not in text
    for shown in ("[link=https://evil.example/]S0[/link]", "[blink red]eu", "[/]", "eu\\x1b]0;owned\\x07", "[/] gone\\x1b[2J"):
        assert shown in text


def test_logs_escape_an_agents_control_characters_but_keep_its_tabs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import typer
    from typer.testing import CliRunner

    from ddctl.cli.access import logs
    from ddctl.control import observe
    from ddctl.control.state import State

    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    log = tmp_path / "L0.log"
    log.write_bytes(
        b"2026-01-01T00:00:00Z INFO step\t1\n2026-01-01T00:00:01Z INFO \x1b]0;owned\x07\x1b[2J\x1b[1;31mfake\x1b[0m\n"
    )
    with State() as state:
        state.create_run("r", "regions.yaml", str(tmp_path / "job"), {})
        state.set_run_state("r", "training")
        state.put_instance(InstanceRecord("r", "L0", "eu", "process", "learner", "running", "", time.time(), {"log": str(log)}))
    monkeypatch.setattr(observe, "_targets", lambda run, records: {})  # no running machine: the collected log only
    app = typer.Typer()
    app.command()(logs)
    out = CliRunner().invoke(app, ["L0", "--run", "r"], color=True).output  # color: as on a terminal
    assert "\x1b" not in out and "\x07" not in out
    assert out.splitlines() == [
        "2026-01-01T00:00:00Z INFO step\t1",
        "2026-01-01T00:00:01Z INFO \\x1b]0;owned\\x07\\x1b[2J\\x1b[1;31mfake\\x1b[0m",
    ]

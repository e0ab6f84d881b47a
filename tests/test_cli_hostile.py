"""Inputs a hostile-input audit of the CLI found ending in a traceback: each is now exit 2 with what was wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ddctl.cli.app import app

runner = CliRunner()


def refused(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output, result.output


def test_a_path_that_cannot_be_used_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    """An OSError at the boundary is a path the command was given: a file where a folder is needed here (it was
    exit 1 with a traceback for syncer init, data prepare, pull --out and serve --port-file)."""
    (tmp_path / "afile").write_text("")
    refused(["syncer", "init", str(tmp_path / "afile" / "job")], f"Not a directory: '{tmp_path / 'afile' / 'job'}'")
    assert (tmp_path / "afile").read_text() == ""


def test_pull_from_an_index_that_lists_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "index.json").write_text(json.dumps({"checkpoints": []}))
    refused(["pull", "--from", str(tmp_path / "ck"), "--out", str(tmp_path / "out")], "holds no checkpoint yet")
    assert not (tmp_path / "out").exists()


def test_readmit_checks_its_url(tmp_path: Path) -> None:
    refused(["syncer", "readmit", "L0", "--url", "http://[::1", "--job-dir", str(tmp_path)], "--url: a synchronizer's host")


@pytest.mark.parametrize("kind", ["garbage", "folder"])
def test_a_state_database_that_is_not_one_is_named_with_what_to_do(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path))
    path = tmp_path / "state.sqlite3"
    if kind == "garbage":
        path.write_bytes(bytes(range(256)) * 16)
    else:
        path.mkdir()
    for command in (["ls"], ["status"]):
        refused(command, f"cannot open ddctl's state database {path}")
        refused(command, "it is not a SQLite file: move it aside and ddctl starts a new one")
    assert path.is_dir() or path.read_bytes() == bytes(range(256)) * 16  # nothing overwritten


def test_a_run_name_no_run_can_have_is_no_such_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name with bytes that are not UTF-8 reached SQLite as a lone surrogate (UnicodeEncodeError)."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path))
    refused(["status", "--run", "a\x01b\udcff"], "no run named")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "../../x"], "--run '../../x': a run's name is 1-40 letters"),  # it names folders and object keys
        (["--host", ""], "--host '': give an IP address or a DNS name"),  # it went into the certificate as DNS:
        (["--host", "a b"], "--host 'a b': give an IP address or a DNS name"),
        (["--shards", "0"], "Invalid value for '--shards'"),  # it was taken as one
    ],
)
def test_syncer_init_checks_the_names_it_writes_before_writing(args: list[str], message: str, tmp_path: Path) -> None:
    refused(["syncer", "init", str(tmp_path / "job"), *args], message)
    assert not (tmp_path / "job").exists()


def test_syncer_init_takes_ip_addresses_and_dns_names(tmp_path: Path) -> None:
    result = runner.invoke(app, ["syncer", "init", str(tmp_path / "job"), "--host", "::1", "--host", "sync.example.com",
                                 "--run", "ok-1", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["run"] == "ok-1"


@pytest.mark.parametrize("notice", [float("nan"), float("inf"), -1.0, 3601.0])
def test_a_preemption_notice_must_be_a_number_of_seconds_a_cloud_could_give(notice: float, tmp_path: Path) -> None:
    from ddctl.control.chaos import preempt
    from ddctl.control.state import State
    from ddctl.errors import DdctlError

    with State(tmp_path / "state.sqlite3") as state, pytest.raises(DdctlError, match=r"--notice must be in \[0, 3600\]"):
        preempt("r", state, "east", notice_s=notice)


def replan_args(tmp_path: Path, syncer: str) -> list[str]:
    assert runner.invoke(app, ["syncer", "init", str(tmp_path / "job"), "--shards", "2"]).exit_code == 0
    (tmp_path / "regions.yaml").write_text(
        "run: t\nsyncer: a\nregions:\n"
        "  - {name: a, provider: process, learners: 2, link: {up_mbps: 100, down_mbps: 100}}\n"
        "  - {name: b, provider: process, learners: 1, link: {up_mbps: 100, down_mbps: 100}}\n"
    )
    return ["syncer", "replan", str(tmp_path / "job"), "--regions", str(tmp_path / "regions.yaml"), "--syncer", syncer,
            "--syncer", "https://127.0.0.1:2", "--site", "S0=a", "--site", "S1=b", "--for", "1"]  # fmt: skip


def test_replan_checks_its_shards_urls_at_start(tmp_path: Path) -> None:
    """A malformed --syncer was retried as a failed look every 10 s until --for ran out, and the command exited 0."""
    refused(replan_args(tmp_path, "notaurl"), "--syncer: a synchronizer URL is https://HOST:PORT")


@pytest.mark.parametrize(
    ("command", "url", "message"),
    [
        (["status"], "notaurl", "a synchronizer URL is https://HOST:PORT"),
        (["move", "--fragment", "0", "--to", "S1"], "http://[::1", "a synchronizer's host"),
        (["checkpoint", "--out", "OUT", "--no-evaluate"], "ftp://a:1", "a synchronizer URL is https://HOST:PORT"),
    ],
)
def test_the_shard_commands_check_every_shards_url_before_dialling_one(
    command: list[str], url: str, message: str, tmp_path: Path
) -> None:
    """``syncer move --syncer http://[::1`` ended in httpx's InvalidURL traceback; status and checkpoint said "syncer
    URL must start with https://" without naming the option. A good first URL does not hide a bad second one."""
    assert runner.invoke(app, ["syncer", "init", str(tmp_path / "job"), "--shards", "2"]).exit_code == 0
    args = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    job = str(tmp_path / "job")
    refused(["syncer", *args, job, "--syncer", "https://127.0.0.1:1", "--syncer", url], f"--syncer: {message}")
    assert not (tmp_path / "out").exists()


def test_replan_that_never_reached_a_shard_exits_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ddctl.control.replanning as replanning

    def failing(loop: object, every: float, until: object, on_event: Callable[[dict[str, Any]], None]) -> int:
        on_event({"t": 0.0, "error": "Unavailable: GET /v1/shards: refused"})
        return 0

    monkeypatch.setattr(replanning, "watch", failing)
    result = runner.invoke(app, replan_args(tmp_path, "https://127.0.0.1:1"))
    assert result.exit_code == 6 and "none of 1 look(s) reached the shards" in result.output, result.output

    def answering(loop: object, every: float, until: object, on_event: Callable[[dict[str, Any]], None]) -> int:
        on_event({"t": 0.0, "error": "Unavailable: one look lost"})
        on_event({"t": 1.0, "replan": None})
        return 0

    monkeypatch.setattr(replanning, "watch", answering)
    result = runner.invoke(app, replan_args(tmp_path / "again", "https://127.0.0.1:1"))
    assert result.exit_code == 0 and "0 re-plan(s)" in result.output, result.output  # one answered look is a run


def test_a_ca_certificate_that_is_missing_or_not_one_is_named(tmp_path: Path) -> None:
    """It was '[Errno 2] No such file or directory', naming no file (ssl's error carries none)."""
    from ddctl_agents.agent.client import SyncerClient
    from ddctl_agents.errors import ConfigError

    with pytest.raises(ConfigError, match=f"the CA certificate {tmp_path / 'nosuch.pem'}: No such file or directory"):
        SyncerClient("https://127.0.0.1:1", "t", tmp_path / "nosuch.pem")
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=f"the CA certificate {tmp_path / 'bad.pem'}: .*NO_CERTIFICATE"):
        SyncerClient("https://127.0.0.1:1", "t", tmp_path / "bad.pem")


def test_a_move_checks_its_arguments_before_asking_and_says_when_nothing_was_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the shards down, a move of fragment -1 to S9 said 'run the same command again to finish the move'."""
    from ddctl.control import handoff
    from ddctl.errors import DdctlError, UnreachableError
    from ddctl_agents.agent.client import Unavailable

    def never(url: str) -> Any:
        raise AssertionError("connected before the arguments were checked")

    for fragment, to in ((-1, "S1"), (0, "S9x"), (0, "../S1")):
        with pytest.raises(DdctlError, match="give a fragment >= 0 and a shard named S0, S1"):
            handoff.move(["https://127.0.0.1:1"], never, fragment, to)

    class Down:
        def shards(self) -> Any:
            raise Unavailable("GET /v1/shards: refused")

        def close(self) -> None:
            pass

    monkeypatch.setattr(handoff, "retry", lambda call, give_up_after_s: call())
    with pytest.raises(UnreachableError, match="refused; no move was started, nothing changed"):
        handoff.move(["https://127.0.0.1:1"], lambda url: Down(), 0, "S1")  # type: ignore[arg-type, return-value]


def test_a_plan_checks_the_checkpoint_it_would_resume_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``up --plan --resume-from /nonexist`` printed the plan and exited 0; ``up`` itself would refuse it."""
    monkeypatch.setenv("DDCTL_HOME", str(tmp_path / "home"))
    replan_args(tmp_path, "https://127.0.0.1:1")  # writes regions.yaml (process regions)
    refused(["up", "--plan", "-f", str(tmp_path / "regions.yaml"), "--resume-from", str(tmp_path / "nope")],
            "no such directory; a checkpoint is a directory")  # fmt: skip
    assert not (tmp_path / "home" / "state.sqlite3").exists()  # a plan changes nothing


def test_a_learners_token_only_for_a_learner_the_job_has(tmp_path: Path) -> None:
    """``syncer token JOB L99`` minted a token for a learner a 3-learner job does not have (a typo passes silently)."""
    assert runner.invoke(app, ["syncer", "init", str(tmp_path / "job"), "--learners", "3"]).exit_code == 0
    for name in ("L2", "admin", "relay-east"):
        done = runner.invoke(app, ["syncer", "token", str(tmp_path / "job"), name])
        assert done.exit_code == 0 and done.stdout.startswith(f"{name}."), done.output
    refused(["syncer", "token", str(tmp_path / "job"), "L3"], "L3: this job has learners L0..L2")
    (tmp_path / "job" / "job.json").write_text("{")
    refused(["syncer", "token", str(tmp_path / "job"), "L1"], f"{tmp_path / 'job' / 'job.json'}: not JSON")


@pytest.mark.parametrize("rate", [float("inf"), float("nan"), 0.0, -1.0, 100_001.0])
def test_a_link_rate_tc_cannot_shape_is_refused_before_any_namespace(rate: float) -> None:
    """``bench link --rate inf`` ended in OverflowError (tbf's burst from an infinite rate)."""
    from ddctl.bench.wannet import wan
    from ddctl.errors import DdctlError
    from ddctl.providers.linkshape import check_rates, create_link

    message = r"link rates must be in \(0, 100000\] Mbit/s, got "
    with pytest.raises(DdctlError, match=message):
        check_rates(10.0, rate)
    with pytest.raises(DdctlError, match=message):
        create_link("ddbad0", rate)
    with pytest.raises(DdctlError, match=message), wan("ddbad", {"a": (10.0, 10.0), "b": (rate, 10.0)}):
        pass
    check_rates(0.5, 100_000.0, None)  # a rate not given is not checked
    refused(["bench", "link", "--rate", str(rate)], "link rates must be in (0, 100000] Mbit/s")

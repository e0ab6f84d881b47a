"""The CLI's small promises: ``--version``, help that fits 80 columns, agents that read like ddctl, true exit codes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from ddctl.cli import errors as cli_errors
from ddctl.cli.app import app
from ddctl_agents import entrypoint
from ddctl_agents import errors as agent_errors
from ddctl_agents.agent.run import main as learner_main
from ddctl_agents.service.server import main as syncer_main

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
WIDTH = 80


def commands(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group under ``ddctl``, with the words that reach it."""
    command = typer.main.get_command(app) if command is None else command
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name))


COMMANDS = list(commands())


def words(text: str) -> str:
    return " ".join(text.split())


def squash(text: str) -> str:
    """Without any whitespace: click may wrap a line after a hyphen."""
    return "".join(text.split())


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_installed_version(flag: str) -> None:
    result = runner.invoke(app, [flag])
    assert result.exit_code == 0 and result.stdout == f"ddctl {version('ddctl')}\n"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "ddctl")
def test_help_fits_80_columns_and_cuts_no_name(path: tuple[str, ...]) -> None:
    command = dict(COMMANDS)[path]
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"Usage: ddctl {' '.join(path)}".rstrip()), lines[0]
    assert not [line for line in lines if len(line) > WIDTH], result.output
    assert "…" not in result.output
    for param in command.params:  # every flag in full, and a default written in a help text is not eaten
        for name in (*param.opts, *param.secondary_opts):
            assert re.search(rf"(^|[\s,]){re.escape(name)}([\s,]|$)", result.output, re.M), f"{name} cut:\n{result.output}"
        if param.help and "[default:" in param.help:
            assert words(param.help) in words(result.output)
    if isinstance(command, TyperGroup):  # each subcommand with its whole first sentence, never cut with "..."
        for name, sub in command.commands.items():
            assert re.search(rf"^  {re.escape(name)}\s", result.output, re.M)
            summary = sub.get_short_help_str(10_000)
            assert squash(summary) in squash(result.output) and not summary.endswith("..."), summary


def agent_help(main: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal still gets 78 columns, as ddctl's help does
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("main", [learner_main, syncer_main], ids=["learner run", "syncer serve"])
def test_the_agents_help_reads_like_ddctls(
    main: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = agent_help(main, capsys, monkeypatch)
    lines = text.splitlines()
    assert re.fullmatch(r"Usage: ddctl (learner run|syncer serve) \[OPTIONS\]", lines[0])
    assert lines[1] == "" and lines[2].startswith("  ") and "Options:" in lines
    assert max(map(len, lines)) <= WIDTH - 2
    assert lines[-1].split() == ["--help", "Show", "this", "message", "and", "exit."]
    assert "[required]" in text and "[default: " in text
    for line in lines:  # typer's conventions: <type> after a flag that takes a value, help as a sentence
        flag = re.match(r"  (--[a-z-]+)( <(int|float|str|path)>)?( {2,}(.))?", line)
        if flag and flag.group(5):
            assert flag.group(5).isupper(), line


def test_the_agents_show_their_defaults(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    learner = words(agent_help(learner_main, capsys, monkeypatch))
    assert (
        "--parallel-uploads auto|N Uploads in flight at once: N, or auto (as few as keep the measured uplink busy, up to 3)."
        in learner
    )
    assert "up to 3). [default: auto]" in learner
    assert "--syncer <str> The syncer's URL" in learner and "--plaintext" not in learner
    syncer = words(agent_help(syncer_main, capsys, monkeypatch))
    assert "[default: 127.0.0.1:0]" in syncer and "--snapshot-every <float> Seconds between snapshots. [default: 30.0]" in syncer


@pytest.mark.parametrize("argv", [["--bogus"], ["--syncer", "x", "--name", "L0", "--bogus=1"], ["--parallel", "2"]])
def test_a_bad_flag_exits_2_naming_it(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        learner_main(argv)
    err = capsys.readouterr().err
    bad = next(a for a in argv if a.startswith("--b") or a == "--parallel").partition("=")[0]
    assert done.value.code == 2
    assert err.startswith("Usage: ddctl learner run [OPTIONS]\nTry 'ddctl learner run --help' for help.\n")
    assert f"Error: No such option: {bad}\n" in err  # not abbreviated to --parallel-uploads, as click would not


def test_a_bad_value_and_a_missing_flag_are_named_through_ddctl() -> None:
    bad = runner.invoke(app, ["syncer", "serve", "--job-dir", "j", "--snapshot-every", "soon"])
    assert bad.exit_code == 2 and "argument --snapshot-every: invalid float value: 'soon'" in bad.output
    missing = runner.invoke(app, ["learner", "run", "--syncer", "https://127.0.0.1:1"])
    assert missing.exit_code == 2 and "the following arguments are required: --name" in missing.output


def test_an_agent_error_is_one_line_with_ddctls_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert syncer_main(["--job-dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ddctl syncer serve: error: ") and "cannot read" in err and "\n" not in err


def test_the_agents_exit_codes_are_ddctls() -> None:
    """Each agent error ends its process with the code ddctl's table gives it (6: the syncer unreachable)."""
    for cls in [c for c in vars(agent_errors).values() if isinstance(c, type) and issubclass(c, agent_errors.AgentError)]:
        exc = cls(400, "x", "y") if cls is agent_errors.Refused else cls("x")
        assert entrypoint.exit_code_for(exc) == cli_errors.exit_code_for(exc), cls
    assert entrypoint.exit_code_for(agent_errors.Unavailable("gone")) == cli_errors.EXIT_UNREACHABLE == 6
    for exc, code in ((NotADirectoryError(20, "x"), 2), (ConnectionRefusedError(111, "x"), 6), (TimeoutError(), 6)):
        assert entrypoint.exit_code_for(exc) == cli_errors.exit_code_for(exc) == code, exc  # a path; a peer gone
    for name in ("EXIT_OK", "EXIT_INTERNAL", "EXIT_USAGE", "EXIT_DATA", "EXIT_UNREACHABLE"):
        assert getattr(entrypoint, name) == getattr(cli_errors, name)


def readme_exit_codes() -> dict[int, str]:
    """The README's exit-code table: ``| code | meaning |`` rows after "Exit codes"."""
    text = (ROOT / "README.md").read_text()
    start = text.index("Exit codes")
    table = text[start : text.index("\n\n", text.index("| code |", start))]
    return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| (.+) \|$", table, re.M)}


def test_the_readme_lists_exactly_the_exit_codes_of_errors_py() -> None:
    codes = {value for name, value in vars(cli_errors).items() if name.startswith("EXIT_") and isinstance(value, int)}
    listed = readme_exit_codes()
    assert set(listed) == codes == {0, 1, 2, 3, 4, 5, 6, 7, 130}
    docstring = words(cli_errors.__doc__ or "")
    for code in codes - {0}:  # the module's own table says each one too
        assert re.search(rf"\b{code} [a-z(]", docstring), code
    assert "reached" in listed[6] and "provision" in listed[7]

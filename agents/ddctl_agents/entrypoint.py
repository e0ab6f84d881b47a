"""What every long-running agent process shares on its command line: its parser, exit codes, labels, logging.

The agents stay on argparse (a VM gets no typer), but read like ddctl: one
:class:`Parser` lays help out as ddctl's plain click help does (``Usage:``,
the description, ``Options:`` with ``<type>`` and ``[default: ...]``, wrapped
at 78 columns), refuses a bad flag as click does (usage, a hint, exit 2), and
:func:`report` ends a run on an error with the exit code ddctl's table
(``ddctl/cli/errors.py``) gives the same error.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, NoReturn

from ddctl_agents.errors import AgentError, CheckpointError, TapeError, Unavailable, WireError

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_DATA, EXIT_UNREACHABLE = 0, 1, 2, 3, 6
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (TapeError, EXIT_DATA),
    (WireError, EXIT_DATA),
    (CheckpointError, EXIT_DATA),
    (Unavailable, EXIT_UNREACHABLE),
    (AgentError, EXIT_USAGE),
    (ConnectionError, EXIT_UNREACHABLE),
    (TimeoutError, EXIT_UNREACHABLE),
    (OSError, EXIT_USAGE),
)
"""ddctl's codes for the errors an agent can end with (a test holds the two tables to the same answers);
first match wins. 2 bad usage or settings, 3 bad input data, 6 the syncer could not be reached."""


def exit_code_for(exc: BaseException) -> int:
    return next((code for cls, code in EXIT_CODES if isinstance(exc, cls)), EXIT_INTERNAL)


def report(prog: str, exc: BaseException, what: str = "") -> int:
    """Print ``PROG: error: [WHAT: ]EXC`` on stderr, as ddctl does, and return the error's exit code."""
    print(f"{prog}: error: {what + ': ' if what else ''}{exc}", file=sys.stderr)
    return exit_code_for(exc)


HELP_COLUMNS = 80
TYPE_NAMES: dict[Any, str] = {None: "str", str: "str", int: "int", float: "float", Path: "path"}
"""An option's value type as typer names it in help: ``--max-steps <int>``."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse help in ddctl's layout: click's columns (help at column 34 at most), 78 wide, defaults shown."""

    def __init__(self, prog: str) -> None:
        width = max(min(shutil.get_terminal_size().columns, HELP_COLUMNS) - 2, 50)
        super().__init__(prog, indent_increment=2, max_help_position=34, width=width)

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)

    def start_section(self, heading: str | None) -> None:
        super().start_section({"options": "Options", "positional arguments": "Arguments"}.get(heading or "", heading))

    def _format_text(self, text: str) -> str:
        """The description, indented by two like click's."""
        self._indent()
        try:
            return super()._format_text(text)
        finally:
            self._dedent()

    def _format_action_invocation(self, action: argparse.Action) -> str:
        names = ", ".join(action.option_strings) or action.dest
        if action.nargs == 0:
            return names
        kind = "|".join(map(str, action.choices)) if action.choices else TYPE_NAMES.get(action.type, "str")
        return f"{names} {action.metavar or f'<{kind}>'}"

    def _get_help_string(self, action: argparse.Action) -> str:
        """The help sentence, then ``[required]`` or ``[default: X]`` two spaces after it, as click writes them."""
        shown = action.default not in (None, "", [], argparse.SUPPRESS) and action.nargs != 0
        extra = "[required]" if action.required else f"[default: {action.default}]" if shown else ""
        return f"{action.help or ''}  {extra.replace('%', '%%')}" if extra else action.help or ""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(re.sub(r"\s*\n\s*", " ", text.strip()), width, break_on_hyphens=False)  # --flag-names whole


class Parser(argparse.ArgumentParser):
    """An agent's command line: ``Usage: PROG [OPTIONS]``, ddctl's help layout, ``--help`` last, click's errors."""

    def __init__(self, prog: str, description: str) -> None:
        super().__init__(
            prog=prog,
            usage="%(prog)s [OPTIONS]",
            description=description,
            formatter_class=HelpFormatter,
            add_help=False,
            allow_abbrev=False,  # as click: a flag is spelt in full, so a typo is never taken for another flag
        )

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """An unknown flag is named first (before any missing one), as click names it."""
        argv = sys.argv[1:] if args is None else list(args)
        self._add_help()
        for token in argv[: argv.index("--") if "--" in argv else len(argv)]:
            name = token.partition("=")[0]
            if name.startswith("--") and name not in self._option_string_actions:
                self.error(f"No such option: {name}")
        return super().parse_args(argv, namespace)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._add_help()
        return super().parse_known_args(args, namespace)

    def _add_help(self) -> None:
        """``--help`` is added last so that it is listed last, as in ddctl."""
        if "--help" not in self._option_string_actions:
            self.add_argument("--help", action="help", help="Show this message and exit.")

    def error(self, message: str) -> NoReturn:
        """A bad flag: the usage, a hint and ``Error: ...`` naming the flag, exit 2, as click reports it."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"Try '{self.prog} --help' for help.\n\nError: {message}\n")


def add_label_option(parser: argparse.ArgumentParser) -> None:
    """``--label KEY=VALUE`` (repeatable): read by providers from the command line, ignored by the process."""
    parser.add_argument("--label", action="append", default=[], help="A KEY=VALUE tag ddctl finds this process by (repeatable).")


LOG_FORMAT = "%(asctime)s.%(msecs)03dZ %(name)s %(levelname)s %(message)s"
LOG_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
"""Lines start with an ISO 8601 UTC time (``2026-11-30T12:34:56.789Z``): ``ddctl logs --since`` reads it, and a
VM's clock zone never makes a line ambiguous on the laptop."""
CHATTY = ("httpx", "httpcore", "hpack", "h2", "hypercorn.access")
"""Libraries that log every request or frame at INFO: a heartbeat every half second would drown the progress lines."""


def configure_logging(level: int = logging.INFO) -> None:
    """INFO by default: the agents' progress lines (``ddctl logs``) are INFO; retries and refusals are WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter(LOG_FORMAT, LOG_TIME_FORMAT)
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler])
    for name in CHATTY:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))

"""How ``--help`` reads: click's plain layout, wrapped at 78 columns, nothing cut.

ddctl's help is plain text (the app sets ``rich_markup_mode=None``), for three
reasons. Rich's option table gives each of its six columns a share of the
width, so at 80 columns it cut long flags (``--push-before-overw…``) and left
the help text a word per line; rich markup ate every ``[default: ...]`` that a
help text wrote by hand; and the agents' argparse help
(``ddctl_agents.entrypoint.HelpFormatter``) can look exactly like plain click,
so ``ddctl learner run --help`` reads like every other command. Click lists
subcommands with their first sentence cut to fit one line ("...");
:class:`HelpGroup` lists the whole sentence, wrapped instead.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

SUMMARY_CHARS = 10_000
"""A first sentence is never shortened: click cuts it at this many characters (never, in practice)."""


class HelpGroup(TyperGroup):
    """A command group whose command list shows each command's whole first sentence, wrapped."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(SUMMARY_CHARS)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

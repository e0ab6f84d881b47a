"""What every long-running agent process shares on its command line: discovery labels and logging."""

from __future__ import annotations

import argparse
import logging
import sys


def add_label_option(parser: argparse.ArgumentParser) -> None:
    """``--label KEY=VALUE`` (repeatable): read by providers from the command line, ignored by the process."""
    parser.add_argument(
        "--label", action="append", default=[], help="KEY=VALUE tag for discovery (ddctl down finds processes by it)"
    )


def configure_logging(level: int = logging.WARNING) -> None:
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")

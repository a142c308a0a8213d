"""Command-line pieces of the bench's commands that have a parser of their own
(``noisy-neighbour``, ``search-team``): the sizes ``--quick`` shrinks, and the
node to target."""

from __future__ import annotations

import argparse
from typing import NamedTuple


class Size(NamedTuple):
    """An option's value in a full run and with ``--quick``, and what it sizes."""

    full: int | float
    quick: int | float
    what: str


def bench_parser(
    command: str, doc: str | None, quick: str, sizes: dict[str, Size]
) -> argparse.ArgumentParser:
    """``scopenode bench COMMAND``, described by the first paragraph of ``doc``,
    with ``--quick`` (``quick`` says what it runs) and an option per size, left
    unset so that :func:`fill_sizes` knows which were given."""
    parser = argparse.ArgumentParser(
        prog=f"scopenode bench {command}", description=(doc or "").split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    for name, size in sizes.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(size.full),
            help=f"{size.what} (default {size.full:,g})",
        )
    return parser


def fill_sizes(args: argparse.Namespace, sizes: dict[str, Size]) -> None:
    """Each size not given takes its full-run or ``--quick`` value."""
    for name, size in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, size.quick if args.quick else size.full)


def add_target_options(parser: argparse.ArgumentParser, url_help: str) -> None:
    """``--url``, ``--data-dir`` and ``--database-url``: the node ``open_node`` opens."""
    target = parser.add_argument_group("target")
    target.add_argument("--url", help=url_help)
    target.add_argument("--data-dir", help="node data dir for admin commands (with --url)")
    target.add_argument("--database-url", help="PostgreSQL URL of the node")

"""The parser's building blocks every command module uses: the parser class that reports a usage error as
one line and exit 2, a subcommand with its examples, `--json`, and the argument types that hold input to the
bounds the event schema holds it to. Standard library and the schema's bounds only: every command's parser
is built for every command, `--help` included."""

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ftrain.events.run_id import InvalidRunId, validate_run_id
from ftrain.events.schema import INT64_MAX, MAX_AMOUNT

Subparsers = Any
"""What `add_subparsers` returns (argparse's `_SubParsersAction`, private): where a module adds commands."""

MAX_HANG_TIMEOUT = 7 * 24 * 3600


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit 2, and shows examples verbatim."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def command(
    sub: Subparsers, name: str, text: str, examples: Sequence[str], more: str = ""
) -> argparse.ArgumentParser:
    """A subcommand whose help says what it does, and how it is used in `examples` (shell lines)."""
    shown = "\n".join(f"  $ {e}" for e in examples)
    return sub.add_parser(  # type: ignore[no-any-return]
        name, help=text, description=text[0].upper() + text[1:] + (f".\n\n{more}" if more else "."),
        epilog=f"examples:\n{shown}",
    )  # fmt: skip


def subcommands(p: argparse.ArgumentParser, dest: str) -> Subparsers:
    """The subcommands of `p` (`audit verify`, `keys init`…), chosen into `dest`."""
    return p.add_subparsers(dest=dest, required=True, parser_class=Parser)


def json_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--json", action="store_true", help=f"print {what} as one JSON object (lines for people: stderr)"
    )


def run_id(text: str) -> str:
    try:
        return validate_run_id(text)
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def project(text: str) -> str:
    try:
        return validate_run_id(text, what="project")
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer within [low, high], the bounds the event schema holds it to."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
        return value

    return parse


count = int_in(0, INT64_MAX)
positive = int_in(1, INT64_MAX)


def amount(text: str) -> float:
    """A finite, non-negative number (hours, seconds) within the schema's bound."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= MAX_AMOUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number between 0 and {MAX_AMOUNT:g}")
    return value

"""`ftrain events schema` and `ftrain events tail`, for stream consumers: their parser, and the entries that
load the schema (no connection) or the tail (`cli/tail.py`) only when one runs."""

import argparse
from functools import partial

from ftrain.cli.arguments import Subparsers, command, run_id, subcommands
from ftrain.cli.log_command import Command, nothing, on_the_log


def add_parser(sub: Subparsers) -> None:
    """`events schema`, `events tail`."""
    p = command(sub, "events", "for stream consumers: the stored payload's schema, a verifying tail", [
        "ftrain events tail --follow", "ftrain events schema",
    ])  # fmt: skip
    events = subcommands(p, "events_command")
    p = command(
        events, "schema", "the JSON Schema of a stored payload", ["ftrain events schema | jq '.$defs | keys'"]
    )
    p.set_defaults(entry=_schema)
    p = command(events, "tail", "every event, oldest first, with its chain and signature verdicts", [
        "ftrain events tail RUN", "ftrain events tail --json --follow | jq -c .event_type",
    ])  # fmt: skip
    p.add_argument("run_id", nargs="?", type=run_id, help="only this run (default: every run)")
    p.add_argument("--follow", action="store_true", help="then print new events as they land, until stopped")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(entry=partial(on_the_log, load=_tail, auditing=True))


def _schema(args: argparse.Namespace) -> int:
    """Print the stored payload's JSON Schema: no connection to the log."""
    from ftrain.console.output import emit_text
    from ftrain.events.stored_schema import schema_text

    emit_text(schema_text())
    return 0


def _tail() -> Command:
    from ftrain.cli.tail import run_tail

    return Command(nothing, run_tail)

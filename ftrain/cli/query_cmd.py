"""`ftrain status`, `list`, `cost`, `audit verify` and `replay`, the commands that only read the log: their
parser, and the entry that loads their work (`cli/queries.py`) only when one of them runs."""

from functools import partial

from ftrain.cli.arguments import Subparsers, command, json_flag, project, run_id, subcommands
from ftrain.cli.log_command import Command, nothing, on_the_log


def add_parser(sub: Subparsers) -> None:
    """`status`, `list`, `cost`, `audit verify`, `replay`."""
    p = command(
        sub, "status", "one run's state", ["ftrain status RUN", "ftrain status RUN --json | jq .state"]
    )
    p.add_argument("run_id", type=run_id, help="the run")
    json_flag(p, "the run's status document")
    p.set_defaults(entry=partial(on_the_log, load=_status, leases=True))

    p = command(sub, "list", "runs, optionally of one project", ["ftrain list", "ftrain list P --json"])
    p.add_argument("project", nargs="?", type=project, help="only this project's runs")
    p.add_argument("--with-launch", action="store_true", help="--json: each row with its whole launch event")
    json_flag(p, "the runs, one object each in an array")
    p.set_defaults(entry=partial(on_the_log, load=_list))

    p = command(sub, "cost", "GPU-, CPU- or node-hours per run; with --run, its goodput", [
        "ftrain cost", "ftrain cost P --json", "ftrain cost --run RUN",
    ])  # fmt: skip
    which = p.add_mutually_exclusive_group()
    which.add_argument("project", nargs="?", type=project, help="only this project's runs")
    which.add_argument("--run", type=run_id, help="one run: its goodput, term by term")
    json_flag(p, "the costs")
    p.set_defaults(entry=partial(on_the_log, load=_cost))

    p = command(sub, "audit", "verify the hash chains, signatures and anchors", ["ftrain audit verify"])
    audit = subcommands(p, "audit_command")
    p = command(audit, "verify", "verify every chain from the stream itself (exit 1 on any finding)", [
        "ftrain audit verify", "ftrain audit verify RUN --json",
    ])  # fmt: skip
    p.add_argument("run_id", nargs="?", type=run_id, help="only this run (default: the whole log)")
    json_flag(p, "the report")
    p.set_defaults(entry=partial(on_the_log, load=_audit, auditing=True))

    p = command(sub, "replay", "the timeline, oldest first; --rebuild rebuilds the read model", [
        "ftrain replay RUN", "ftrain replay --rebuild",
    ])  # fmt: skip
    p.add_argument("run_id", nargs="?", type=run_id, help="only this run (default: every run)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the read model from the stream")
    json_flag(p, "the timeline as an array")
    p.set_defaults(entry=partial(on_the_log, load=_replay))


def _status() -> Command:
    from ftrain.cli.queries import run_status

    return Command(nothing, run_status)


def _list() -> Command:
    from ftrain.cli.queries import run_list

    return Command(nothing, run_list)


def _cost() -> Command:
    from ftrain.cli.queries import run_cost

    return Command(nothing, run_cost)


def _audit() -> Command:
    from ftrain.cli.queries import run_audit

    return Command(nothing, run_audit)


def _replay() -> Command:
    from ftrain.cli.queries import run_replay

    return Command(nothing, run_replay)

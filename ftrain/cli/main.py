"""The `ftrain` command line: a thin shell over `ftrain.service.RunService`.

Exit codes: 0 success; 1 refused on the merits (no valid checkpoint, failed audit, illegal transition,
event log unreachable; `run`: gave up retrying); 2 usage or bad input (a home, or a directory in it, that is
not private to this user included); `run` stopped by signal N: 128+N.
Errors are one line on stderr and nothing is written.
"""

import argparse
import asyncio
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import msgspec
import nats.errors

from ftrain.cli.keys_cmd import add_keys_parser
from ftrain.cli.visible import visible
from ftrain.errors import Refused, UsageError
from ftrain.events.jetstream.server import NatsServerError
from ftrain.events.jetstream.store import LogTampered, LogUnavailable
from ftrain.events.keyring import KeyringError
from ftrain.events.private import UnsafeDirectory
from ftrain.events.run_id import InvalidRunId, validate_run_id
from ftrain.events.schema import (
    FAILURE_REASONS,
    INT64_MAX,
    INT64_MIN,
    MAX_AMOUNT,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_SHARDS,
    InvalidEvent,
)
from ftrain.events.stored_schema import stored_schema
from ftrain.settings import InvalidSetting
from ftrain.supervise.launch_spec import STRATEGIES


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _run_id(text: str) -> str:
    try:
        return validate_run_id(text)
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _int_in(low: int, high: int) -> Callable[[str], int]:
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


_count = _int_in(0, INT64_MAX)
_positive = _int_in(1, INT64_MAX)


def _amount(text: str) -> float:
    """A finite, non-negative number (GPU-hours, seconds) within the schema's bound."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= MAX_AMOUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number between 0 and {MAX_AMOUNT:g}")
    return value


def _add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """What `launch` and `run` both take: the project, the allocation, the strategy and the run id."""
    p.add_argument("project", type=lambda t: _run_id_as(t, "project"))
    p.add_argument("--nodes", type=_int_in(1, MAX_NODES), required=True)
    p.add_argument("--gpus-per-node", type=_int_in(1, MAX_GPUS_PER_NODE), required=True)
    p.add_argument("--strategy", choices=STRATEGIES, default="fsdp")
    p.add_argument("--dataset-revision")
    p.add_argument("--checkpoint-every", metavar="10min|500steps")
    p.add_argument(
        "--nodelist", help="comma list or Slurm hostlist (default: SLURM_JOB_NODELIST, PBS_NODEFILE)"
    )
    p.add_argument("--rdzv-port", type=_int_in(1, 65535), default=29500)
    p.add_argument("--run-id", type=_run_id)
    p.add_argument("--tp", type=_positive, default=1, help="megatron tensor-parallel size")
    p.add_argument("--pp", type=_positive, default=1, help="megatron pipeline-parallel size")
    p.add_argument("--deepspeed-config", default="ds_config.json", help="zero: DeepSpeed config path")


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    parser = _Parser(
        prog="ftrain", description="Fault-tolerant distributed training: launch, checkpoint, resume."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("launch", help="launch a run through the scheduler's allocation")
    _add_launch_arguments(p)

    p = sub.add_parser(
        "run", help="launch (or relaunch a failed --run-id) and supervise it: retry, resume, record"
    )
    _add_launch_arguments(p)
    p.add_argument(
        "--nproc-per-node",
        type=_int_in(1, MAX_GPUS_PER_NODE),
        help="processes per node (default: --gpus-per-node)",
    )
    p.add_argument("--max-retries", type=_count, default=3, help="relaunches after a failure")
    p.add_argument(
        "--backoff",
        type=_amount,
        default=5.0,
        metavar="SECONDS",
        help="wait before the first relaunch, doubled per failure up to 60 s (default 5)",
    )
    p.add_argument("--max-restarts", type=_count, default=0, help="torchrun's own in-place worker restarts")
    p.add_argument(
        "--min-nodes",
        type=_int_in(1, MAX_NODES),
        help="after a node is lost, relaunch without it while this many are left (default: --nodes: wait "
        "for it); the trainer resumes resharded to the smaller world",
    )
    p.add_argument(
        "--node-exec",
        metavar="TEMPLATE",
        help="start each node's torchrun through this command, {host} filled in (e.g. 'ssh {host}'); "
        "without Slurm, what a run over several nodes needs",
    )

    p = sub.add_parser("checkpoint", help="record a checkpoint (writes it under $FTRAIN_STORAGE)")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("--step", type=_count, required=True)
    p.add_argument("--epoch", type=_count, required=True)
    p.add_argument("--shards", type=_int_in(1, MAX_SHARDS), required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--state", help="training state as JSON")
    source.add_argument("--state-file", type=Path)
    source.add_argument("--path", type=Path, help="a directory of checkpoint files (e.g. DCP shards)")

    p = sub.add_parser("resume", help="resume from the newest valid checkpoint")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("--force", action="store_true", help="resume a run the log still thinks is running")

    p = sub.add_parser("fail", help="record a failure or preemption")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("--reason", choices=FAILURE_REASONS, default="preempted")
    p.add_argument("--exit-code", type=_int_in(INT64_MIN, INT64_MAX))
    p.add_argument("--message", default="")

    p = sub.add_parser("complete", help="record completion and cost")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("--cost-gpu-hours", type=_amount)

    p = sub.add_parser("status", help="one run's state")
    p.add_argument("run_id", type=_run_id)
    p.add_argument("--json", action="store_true")

    for name, text in (("list", "runs, optionally of one project"), ("cost", "GPU-hours per run; goodput")):
        p = sub.add_parser(name, help=text)
        which = p.add_mutually_exclusive_group()
        which.add_argument("project", nargs="?", type=lambda t: _run_id_as(t, "project"))
        if name == "cost":
            which.add_argument("--run", type=_run_id, help="one run: its goodput, term by term")
        p.add_argument("--json", action="store_true")

    p = sub.add_parser("audit", help="verify the hash chains")
    audit = p.add_subparsers(dest="audit_command", required=True, parser_class=_Parser)
    p = audit.add_parser("verify")
    p.add_argument("run_id", nargs="?", type=_run_id)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("replay", help="the timeline, oldest first; --rebuild rebuilds the read model")
    p.add_argument("run_id", nargs="?", type=_run_id)
    p.add_argument("--json", action="store_true")
    p.add_argument("--rebuild", action="store_true")

    p = sub.add_parser("events", help="for stream consumers: the stored payload's schema, a verifying tail")
    events = p.add_subparsers(dest="events_command", required=True, parser_class=_Parser)
    events.add_parser("schema", help="the JSON Schema of a stored payload")
    p = events.add_parser("tail", help="every event, oldest first, with its chain and signature verdicts")
    p.add_argument("run_id", nargs="?", type=_run_id)
    p.add_argument("--follow", action="store_true", help="then print new events as they land, until stopped")
    p.add_argument("--json", action="store_true", help="one JSON object per line")

    p = sub.add_parser(
        "server",
        help="the embedded nats-server; repair: accept a changed stream, on record; credentials --read-only: "
        "the key auditors and stream consumers sign in with",
    )
    p.add_argument("action", choices=("start", "stop", "status", "repair", "credentials"))
    p.add_argument(
        "--read-only", action="store_true", help="credentials: a key that may read and tail, never append"
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="credentials: also write the seed to FILE (0600)")

    p = sub.add_parser("storage", help="the embedded SeaweedFS S3 server, for development and tests")
    p.add_argument("action", choices=("start", "stop", "status"))

    add_keys_parser(sub, _Parser)

    p = sub.add_parser(
        "demo", help="a 2-process CPU training run, SIGKILLed and resumed, checked bit for bit"
    )
    p.add_argument("--log-only", action="store_true", help="the control-plane scenario only (no torch)")
    p.add_argument(
        "--s3", action="store_true", help="checkpoint to the embedded SeaweedFS (`ftrain storage start`)"
    )
    return parser


def _run_id_as(text: str, what: str) -> str:
    try:
        return validate_run_id(text, what=what)
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _split_train_cmd(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    args = list(argv)
    if "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1 :]
    return args, []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ftrain` console script."""
    from ftrain.logs import configure

    args_list, train_cmd = _split_train_cmd(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    if train_cmd and args.command not in ("launch", "run"):
        _fail(2, f"ftrain {args.command}: error: unexpected arguments after --")
    args.train_cmd = train_cmd
    try:
        configure()
        return _dispatch(args)
    except (UsageError, InvalidSetting, InvalidEvent, UnsafeDirectory) as exc:
        _fail(2, f"ftrain {args.command}: error: {exc}")
    except (Refused, LogUnavailable, LogTampered, KeyringError, NatsServerError) as exc:
        _fail(1, f"ftrain {args.command}: {exc}")
    except sqlite3.Error as exc:
        _fail(1, f"ftrain {args.command}: read model error: {exc}")
    except nats.errors.Error as exc:
        _fail(1, f"ftrain {args.command}: event log error: {exc}")
    except OSError as exc:
        _fail(
            1, f"ftrain {args.command}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        )
    except KeyboardInterrupt:
        _fail(130, f"ftrain {args.command}: interrupted")


def _fail(code: int, line: str) -> NoReturn:
    sys.stderr.write(visible(line) + "\n")  # one line, whatever a publisher put in a reason it quotes
    raise SystemExit(code)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "events" and args.events_command == "schema":
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(stored_schema())).decode() + "\n")
        return 0
    if args.command == "keys":
        from ftrain.cli.keys_cmd import keys_command

        return keys_command(args, os.environ)
    if args.command == "server":
        from ftrain.cli.server_cmd import server_command

        return server_command(args, os.environ)
    if args.command == "storage":
        from ftrain.cli.storage_cmd import storage_command

        return storage_command(args.action, os.environ)
    if args.command == "demo":
        from ftrain.cli.shell import Shell

        if args.log_only:
            from ftrain.cli.demo_log import run_log_demo

            return run_log_demo(Shell(main))
        from ftrain.cli.demo import run_demo

        return run_demo(Shell(main), s3=args.s3)
    if args.command == "run":
        from ftrain.cli.launch import supervise

        return supervise(args)
    return asyncio.run(_async_dispatch(args))


async def _async_dispatch(args: argparse.Namespace) -> int:
    from ftrain.cli.commands import COMMANDS
    from ftrain.service import RunService

    command = COMMANDS[args.command]
    prepared = command.prepare(args)
    async with RunService.open(auditing=args.command in ("audit", "events")) as app:
        return await command.run(app, args, prepared)

"""The `ftrain` command line: a thin shell over `ftrain.service.RunService`.

Exit codes: the table in `ftrain.errors` (0 success; 1 refused on the merits or not found; 2 usage or bad
input; 3 a server's `status`: not running; 128+N stopped by signal N). Errors are one line on stderr and
nothing is written.

Start-up is kept to what the command needs: this module imports the standard library, the parser's bounds
and the error classes only; each command imports its own modules when it runs (`ftrain status` never loads
the supervisor, `--help` never loads the log's client).
"""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ftrain.console.visible import visible
from ftrain.errors import EXIT_CODES
from ftrain.events.lease_record import DEFAULT_TTL, MAX_TTL, MIN_TTL
from ftrain.events.run_id import InvalidRunId, validate_run_id
from ftrain.events.schema import (
    FAILURE_REASONS,
    INT64_MAX,
    INT64_MIN,
    MAX_AMOUNT,
    MAX_CPUS_PER_NODE,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_SHARDS,
)
from ftrain.supervise.launch_spec import STRATEGIES

CLOSED_PIPE = 141
"""128 + SIGPIPE: what a shell reports for `git log | head`'s git."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit 2, and shows examples verbatim."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


class _Version(argparse.Action):
    """`--version`: the installed package's version (pyproject.toml holds it), read only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import version

        from ftrain.console.output import emit

        emit(f"ftrain {version('ftrain')}")
        parser.exit()


def _run_id(text: str) -> str:
    try:
        return validate_run_id(text)
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _project(text: str) -> str:
    try:
        return validate_run_id(text, what="project")
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
MAX_HANG_TIMEOUT = 7 * 24 * 3600
_positive = _int_in(1, INT64_MAX)


def _amount(text: str) -> float:
    """A finite, non-negative number (hours, seconds) within the schema's bound."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= MAX_AMOUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number between 0 and {MAX_AMOUNT:g}")
    return value


def _command(
    sub: Any, name: str, text: str, examples: Sequence[str], more: str = ""
) -> argparse.ArgumentParser:
    """A subcommand whose help says what it does, and how it is used in `examples` (shell lines)."""
    shown = "\n".join(f"  $ {e}" for e in examples)
    return sub.add_parser(  # type: ignore[no-any-return]
        name, help=text, description=text[0].upper() + text[1:] + (f".\n\n{more}" if more else "."),
        epilog=f"examples:\n{shown}",
    )  # fmt: skip


def _json(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--json", action="store_true", help=f"print {what} as one JSON object (lines for people: stderr)"
    )


def _add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """What `launch` and `run` both take: the project, the allocation, the strategy and the run id."""
    p.add_argument(
        "project", type=_project, help="the project the run belongs to (part of the default run id)"
    )
    p.add_argument("--nodes", type=_int_in(1, MAX_NODES), required=True, help="nodes the job spans")
    p.add_argument(
        "--gpus-per-node",
        type=_int_in(1, MAX_GPUS_PER_NODE),
        help="GPUs per node, one process each; leave it out for a CPU job (costed in node-hours)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=_int_in(1, MAX_GPUS_PER_NODE),
        help="processes per node (default: --gpus-per-node; a CPU job: 1)",
    )
    p.add_argument(
        "--cpus-per-node",
        type=_int_in(1, MAX_CPUS_PER_NODE),
        help="a CPU job: the CPUs it holds per node, to cost it in CPU-hours instead of node-hours",
    )
    p.add_argument(
        "--strategy", choices=STRATEGIES, default="fsdp", help="how the job shards its model (default fsdp)"
    )
    p.add_argument(
        "--dataset-revision", help="the data's version, recorded with the launch and every manifest"
    )
    p.add_argument(
        "--checkpoint-every",
        metavar="DURATION|Nsteps",
        help="the trainer's cadence: 10min, 90s, 1h30m, 2h, Slurm's [D-]HH:MM:SS or MM:SS, or 500steps",
    )
    p.add_argument(
        "--nodelist", help="comma list or Slurm hostlist (default: SLURM_JOB_NODELIST, PBS_NODEFILE)"
    )
    p.add_argument(
        "--rdzv-port",
        type=_int_in(1, 65535),
        help="torchrun's rendezvous port (default 29500; inside a Slurm or PBS job 20000 + the job id mod 10000, "
        "so jobs sharing a node never share a rendezvous)",
    )
    p.add_argument(
        "--run-id",
        type=_run_id,
        help="the run's id (default dist-PROJECT-NODESxPROCS-STRATEGY, -2, -3… when taken; inside a Slurm job "
        "PROJECT-slurm-$SLURM_JOB_ID, a PBS job PROJECT-pbs-JOBNUMBER, so a requeued job resumes it); `run`: an "
        "existing failed one is relaunched",
    )
    p.add_argument("--tp", type=_positive, default=1, help="megatron tensor-parallel size")
    p.add_argument("--pp", type=_positive, default=1, help="megatron pipeline-parallel size")
    p.add_argument("--deepspeed-config", default="ds_config.json", help="zero: DeepSpeed config path")


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    codes = "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES)
    parser = _Parser(
        prog="ftrain",
        description="Fault-tolerant distributed training: launch, checkpoint, resume.",
        epilog="examples:\n  $ ftrain run P --nodes 1 --gpus-per-node 8 -- train.py\n  $ ftrain list\n\n"
        f"exit codes:\n{codes}",
    )
    parser.add_argument("--version", action=_Version, help="print ftrain's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = _command(sub, "launch", "record a launch and print each host's torchrun command", [
        "ftrain launch P --nodes 2 --gpus-per-node 4 --nodelist 'node[07-08]' -- train.py --lr 3e-4",
        "ftrain launch P --nodes 1 --nproc-per-node 4 --strategy ddp --json",
    ])  # fmt: skip
    _add_launch_arguments(p)
    _json(p, "the launch")

    p = _command(sub, "run", "launch (or relaunch a failed --run-id) and supervise it: retry, resume, record", [
        "ftrain run P --nodes 1 --gpus-per-node 8 --checkpoint-every 1h30m -- train.py",
        "ftrain run P --nodes 1 --nproc-per-node 2 --strategy ddp --max-retries 5 -- -m mypkg.train",
        "RUN=$(ftrain run P --nodes 1 --gpus-per-node 8 --json -- train.py | tail -1 | jq -r .run_id)",
    ], "The training processes' own output is theirs: with --json the last stdout line is ftrain's object.")  # fmt: skip
    _add_launch_arguments(p)
    p.add_argument("--max-retries", type=_count, default=3, help="relaunches after a failure (default 3)")
    p.add_argument(
        "--backoff",
        type=_amount,
        default=5.0,
        metavar="SECONDS",
        help="wait before the first relaunch, doubled per failure up to 60 s (default 5)",
    )
    p.add_argument(
        "--max-restarts", type=_count, default=0, help="torchrun's own in-place worker restarts (default 0)"
    )
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
    p.add_argument(
        "--requeue-on-failure",
        action="store_true",
        help="inside a Slurm (or PBS) job: when this allocation cannot go on (preempted, retries exhausted, a "
        "node lost that --min-nodes needs), requeue the job (`scontrol requeue $SLURM_JOB_ID`; PBS: `qrerun`) "
        "instead of ending it; the requeued job resumes the same run (PROJECT-slurm-JOBID). E.g. in an sbatch "
        "script: exec ftrain run P --nodes $SLURM_NNODES --gpus-per-node 8 --requeue-on-failure -- train.py",
    )
    p.add_argument(
        "--lease-ttl",
        type=_int_in(MIN_TTL, MAX_TTL),
        default=DEFAULT_TTL,
        metavar="SECONDS",
        help=f"the supervisor's lease on the run, renewed every third of it (default {DEFAULT_TTL}): a "
        "relaunch (ftrain run --run-id X) finding it expired records the run failed (lost) and takes over, "
        "within this long of the supervisor's death; while it is renewed a second supervisor is refused",
    )
    p.add_argument(
        "--hang-timeout",
        type=_int_in(1, MAX_HANG_TIMEOUT),
        metavar="SECONDS",
        help="end an attempt none of whose ranks finished a step for this long (a hung collective, a "
        "stopped node) as failed (hang) and relaunch it; a rank saving a checkpoint gets 10 times as "
        "long; e.g. --hang-timeout 600 (default: off)",
    )
    _json(p, "the outcome (run id, state, last attempt, exit code)")

    p = _command(sub, "checkpoint", "record a checkpoint (writes it under $FTRAIN_STORAGE)", [
        "ftrain checkpoint RUN --step 500 --epoch 2 --shards 8 --state '{\"lr\": 0.0003}'",
        "ftrain checkpoint RUN --step 1000 --epoch 5 --shards 8 --path ./dcp/step-1000",
    ])  # fmt: skip
    p.add_argument("run_id", type=_run_id, help="the run")
    p.add_argument("--step", type=_count, required=True, help="the training step the checkpoint holds")
    p.add_argument("--epoch", type=_count, required=True, help="the epoch the checkpoint holds")
    p.add_argument("--shards", type=_int_in(1, MAX_SHARDS), required=True, help="how many shards it has")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--state", help="training state as JSON")
    source.add_argument("--state-file", type=Path, help="training state as a JSON file")
    source.add_argument("--path", type=Path, help="a directory of checkpoint files (e.g. DCP shards)")
    _json(p, "the recorded checkpoint")

    p = _command(sub, "resume", "resume from the newest valid checkpoint, skipping corrupt ones", [
        "ftrain resume RUN", "ftrain resume RUN --force --json",
    ])  # fmt: skip
    p.add_argument("run_id", type=_run_id, help="the failed run")
    p.add_argument("--force", action="store_true", help="resume a run the log still thinks is running")
    _json(p, "the resume and what it skipped")

    p = _command(sub, "fail", "record a failure or preemption", [
        "ftrain fail RUN --reason preempted", "ftrain fail RUN --reason oom --exit-code 137 --message 'rank 3'",
    ])  # fmt: skip
    p.add_argument("run_id", type=_run_id, help="the running run")
    p.add_argument(
        "--reason", choices=FAILURE_REASONS, default="preempted", help="why it stopped (default preempted)"
    )
    p.add_argument("--exit-code", type=_int_in(INT64_MIN, INT64_MAX), help="the job's exit code, if known")
    p.add_argument("--message", default="", help="free text kept with the failure")
    _json(p, "the failure")

    p = _command(sub, "complete", "record completion and cost", [
        "ftrain complete RUN", "ftrain complete RUN --cost-gpu-hours 12.5 --json",
    ])  # fmt: skip
    p.add_argument("run_id", type=_run_id, help="the running run")
    p.add_argument(
        "--cost-gpu-hours",
        dest="cost_hours",
        type=_amount,
        help="the cost to record, in the run's unit (GPU-hours; a CPU job's CPU- or node-hours); default: "
        "running wall time × what it was launched with",
    )
    _json(p, "the completion")

    p = _command(
        sub, "status", "one run's state", ["ftrain status RUN", "ftrain status RUN --json | jq .state"]
    )
    p.add_argument("run_id", type=_run_id, help="the run")
    _json(p, "the run's status document")

    p = _command(sub, "list", "runs, optionally of one project", ["ftrain list", "ftrain list P --json"])
    p.add_argument("project", nargs="?", type=_project, help="only this project's runs")
    p.add_argument("--with-launch", action="store_true", help="--json: each row with its whole launch event")
    _json(p, "the runs, one object each in an array")

    p = _command(sub, "cost", "GPU-, CPU- or node-hours per run; with --run, its goodput", [
        "ftrain cost", "ftrain cost P --json", "ftrain cost --run RUN",
    ])  # fmt: skip
    which = p.add_mutually_exclusive_group()
    which.add_argument("project", nargs="?", type=_project, help="only this project's runs")
    which.add_argument("--run", type=_run_id, help="one run: its goodput, term by term")
    _json(p, "the costs")

    p = _command(sub, "audit", "verify the hash chains, signatures and anchors", ["ftrain audit verify"])
    audit = p.add_subparsers(dest="audit_command", required=True, parser_class=_Parser)
    p = _command(audit, "verify", "verify every chain from the stream itself (exit 1 on any finding)", [
        "ftrain audit verify", "ftrain audit verify RUN --json",
    ])  # fmt: skip
    p.add_argument("run_id", nargs="?", type=_run_id, help="only this run (default: the whole log)")
    _json(p, "the report")

    p = _command(sub, "replay", "the timeline, oldest first; --rebuild rebuilds the read model", [
        "ftrain replay RUN", "ftrain replay --rebuild",
    ])  # fmt: skip
    p.add_argument("run_id", nargs="?", type=_run_id, help="only this run (default: every run)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the read model from the stream")
    _json(p, "the timeline as an array")

    p = _command(sub, "events", "for stream consumers: the stored payload's schema, a verifying tail", [
        "ftrain events tail --follow", "ftrain events schema",
    ])  # fmt: skip
    events = p.add_subparsers(dest="events_command", required=True, parser_class=_Parser)
    _command(
        events, "schema", "the JSON Schema of a stored payload", ["ftrain events schema | jq '.$defs | keys'"]
    )
    p = _command(events, "tail", "every event, oldest first, with its chain and signature verdicts", [
        "ftrain events tail RUN", "ftrain events tail --json --follow | jq -c .event_type",
    ])  # fmt: skip
    p.add_argument("run_id", nargs="?", type=_run_id, help="only this run (default: every run)")
    p.add_argument("--follow", action="store_true", help="then print new events as they land, until stopped")
    p.add_argument("--json", action="store_true", help="one JSON object per line")

    p = _command(sub, "server", "the embedded nats-server that holds the log", [
        "ftrain server start", "ftrain server status --json", "ftrain server credentials --read-only --out r.nk",
    ], "repair: accept a changed stream, on record; credentials --read-only: the key auditors and stream "
       "consumers sign in with.")  # fmt: skip
    p.add_argument(
        "action", choices=("start", "stop", "status", "repair", "credentials"), help="what to do with it"
    )
    p.add_argument(
        "--read-only", action="store_true", help="credentials: a key that may read and tail, never append"
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="credentials: also write the seed to FILE (0600)")
    _json(p, "what the action found or did")

    p = _command(sub, "storage", "the embedded SeaweedFS S3 server, for development and tests", [
        "ftrain storage start", "eval \"$(ftrain storage status --json | jq -r .exports)\"",
    ])  # fmt: skip
    p.add_argument("action", choices=("start", "stop", "status"), help="what to do with it")
    _json(p, "what the action found or did")

    from ftrain.cli.keys_cmd import add_keys_parser

    add_keys_parser(sub, _Parser, _command, _json)
    from ftrain.cli import metrics_cmd

    metrics_cmd.add_parser(sub, _command, _json)

    from ftrain.cli.export_cmd import add_export_parser

    add_export_parser(sub, _command, _json, _run_id, _count)

    from ftrain.cli import ui_cmd

    ui_cmd.add_parser(sub, _command)

    p = _command(sub, "demo", "a 2-process CPU training run, SIGKILLed and resumed, checked bit for bit", [
        "ftrain demo", "ftrain demo --log-only",
    ])  # fmt: skip
    p.add_argument("--log-only", action="store_true", help="the control-plane scenario only (no torch)")
    p.add_argument(
        "--s3", action="store_true", help="checkpoint to the embedded SeaweedFS (`ftrain storage start`)"
    )

    p = _command(sub, "completion", "print the shell completion script", [
        "ftrain completion bash > ~/.local/share/bash-completion/completions/ftrain",
        "ftrain completion zsh > ~/.zfunc/_ftrain", "source <(ftrain completion bash)",
    ])  # fmt: skip
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    return parser


def _split_train_cmd(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    args = list(argv)
    if "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1 :]
    return args, []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ftrain` console script."""
    from ftrain.console import output

    args_list, train_cmd = _split_train_cmd(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
    except BrokenPipeError:  # `ftrain --help | head -1`
        _closed_pipe()
    except output.OutputUnwritable as exc:  # `ftrain --version >/dev/full`
        _unwritable("ftrain", exc)
    if train_cmd and args.command not in ("launch", "run"):
        _fail(2, f"ftrain {args.command}: error: unexpected arguments after --")
    args.train_cmd = train_cmd
    output.json_mode(bool(getattr(args, "json", False)))
    try:
        output.require_stdout()
        _structlog_without_rich()
        from ftrain.logs import configure

        configure()
        return _dispatch(args)
    except output.OutputClosed:
        _closed_pipe()
    except output.OutputUnwritable as exc:
        _unwritable(f"ftrain {args.command}", exc)
    except KeyboardInterrupt:
        _fail(130, f"ftrain {args.command}: interrupted")
    except Exception as exc:
        code, line = _refusal(args.command, exc)
        _fail(code, line)
    finally:
        output.json_mode(False)


def _structlog_without_rich() -> None:
    """Import structlog with `rich` out of its reach: its development renderer would load rich (0.06 s) for
    tracebacks this CLI never renders. Only in this process, and only when neither is loaded yet."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


_USAGE = (
    ("ftrain.errors", "UsageError"),
    ("ftrain.settings", "InvalidSetting"),
    ("ftrain.events.schema", "InvalidEvent"),
    ("ftrain.events.private", "UnsafeDirectory"),
)
_REFUSED = (
    ("ftrain.errors", "Refused"),
    ("ftrain.events.log_port", "LogUnavailable"),
    ("ftrain.events.log_port", "LogTampered"),
    ("ftrain.events.keyring", "KeyringError"),
    ("ftrain.events.jetstream.server", "NatsServerError"),
)


def _loaded(names: Sequence[tuple[str, str]]) -> tuple[type[BaseException], ...]:
    """The named exception classes whose modules are loaded: one never imported cannot have raised."""
    return tuple(getattr(sys.modules[m], n) for m, n in names if m in sys.modules)


def _refusal(command: str, exc: Exception) -> tuple[int, str]:
    """The exit code and the one line for an exception a command raised; anything else is a bug: re-raised."""
    if isinstance(exc, _loaded(_USAGE)):
        return 2, f"ftrain {command}: error: {exc}"
    if isinstance(exc, _loaded(_REFUSED)):
        return 1, f"ftrain {command}: {exc}"
    if "sqlite3" in sys.modules and isinstance(exc, sys.modules["sqlite3"].Error):
        return 1, f"ftrain {command}: read model error: {exc}"
    if isinstance(exc, _loaded((("nats.errors", "Error"),))):
        return 1, f"ftrain {command}: event log error: {exc}"
    if isinstance(exc, OSError):
        return 1, f"ftrain {command}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    raise exc


def _fail(code: int, line: str) -> NoReturn:
    if sys.stderr is not None:  # closed too: there is no one to tell, the exit code says it
        sys.stderr.write(visible(line) + "\n")  # one line, whatever a publisher put in a reason it quotes
    raise SystemExit(code)


def _closed_pipe() -> NoReturn:
    """The reader of stdout is gone: say nothing (there is no one to tell)."""
    _stdout_to_devnull()
    raise SystemExit(CLOSED_PIPE)


def _unwritable(who: str, exc: Exception) -> NoReturn:
    """Stdout is closed or refuses the write: one line on stderr, exit 1 (as `ls >/dev/full`)."""
    _stdout_to_devnull()
    _fail(1, f"{who}: cannot write the output: {exc}")


def _stdout_to_devnull() -> None:
    """Point descriptor 1 at /dev/null, so the interpreter's own flush at exit finds somewhere to write what
    is still buffered, and says nothing more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _dispatch(args: argparse.Namespace) -> int:
    if handler := getattr(args, "handler", None):  # a command whose module registered its own (`add_parser`)
        return int(handler(args, os.environ))
    if args.command == "completion":
        from ftrain.cli.completion import print_completion

        return print_completion(build_parser(), args.shell)
    if args.command == "events" and args.events_command == "schema":
        from ftrain.console.output import emit_text
        from ftrain.events.stored_schema import schema_text

        emit_text(schema_text())
        return 0
    if args.command == "keys":
        from ftrain.cli.keys_cmd import keys_command

        return keys_command(args, os.environ)
    if args.command == "export":
        from ftrain.cli.export_cmd import export_command

        return export_command(args, os.environ)
    if args.command == "server":
        from ftrain.cli.server_cmd import server_command

        return server_command(args, os.environ)
    if args.command == "storage":
        from ftrain.cli.storage_cmd import storage_command

        return storage_command(args, os.environ)
    if args.command == "demo":
        from ftrain.cli.shell import Shell

        if args.log_only:
            from ftrain.cli.demo_log import run_log_demo

            return run_log_demo(Shell(main))
        from ftrain.cli.demo import run_demo

        return run_demo(Shell(main), s3=args.s3)
    from ftrain.cli.log_server import log_ready

    if args.command == "run":
        from ftrain.cli.launch import supervise

        return supervise(args, lambda: log_ready(args.command, os.environ))
    import asyncio

    return asyncio.run(_async_dispatch(args, log_ready))


async def _async_dispatch(args: argparse.Namespace, log_ready: Callable[[str, Any], None]) -> int:
    from ftrain.cli.commands import command_for
    from ftrain.service import RunService

    command = command_for(args.command)
    prepared = command.prepare(args)
    log_ready(args.command, os.environ)
    auditing = args.command in ("audit", "events")
    async with RunService.open(auditing=auditing, leases=args.command == "status") as app:
        return await command.run(app, args, prepared)

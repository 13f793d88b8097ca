"""`ftrain checkpoint`, `resume`, `fail` and `complete`, the commands that record on a run's log: their
parser, and the entry that loads their work (`cli/commands.py`) only when one of them runs."""

from functools import partial
from pathlib import Path

from ftrain.cli.arguments import Subparsers, amount, command, count, int_in, json_flag, run_id
from ftrain.cli.log_command import Command, nothing, on_the_log
from ftrain.events.schema import FAILURE_REASONS, INT64_MAX, INT64_MIN, MAX_SHARDS


def add_parser(sub: Subparsers) -> None:
    """`checkpoint`, `resume`, `fail`, `complete`."""
    p = command(sub, "checkpoint", "record a checkpoint (writes it under $FTRAIN_STORAGE)", [
        "ftrain checkpoint RUN --step 500 --epoch 2 --shards 8 --state '{\"lr\": 0.0003}'",
        "ftrain checkpoint RUN --step 1000 --epoch 5 --shards 8 --path ./dcp/step-1000",
    ])  # fmt: skip
    p.add_argument("run_id", type=run_id, help="the run")
    p.add_argument("--step", type=count, required=True, help="the training step the checkpoint holds")
    p.add_argument("--epoch", type=count, required=True, help="the epoch the checkpoint holds")
    p.add_argument("--shards", type=int_in(1, MAX_SHARDS), required=True, help="how many shards it has")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--state", help="training state as JSON")
    source.add_argument("--state-file", type=Path, help="training state as a JSON file")
    source.add_argument("--path", type=Path, help="a directory of checkpoint files (e.g. DCP shards)")
    json_flag(p, "the recorded checkpoint")
    p.set_defaults(entry=partial(on_the_log, load=_checkpoint))

    p = command(sub, "resume", "resume from the newest valid checkpoint, skipping corrupt ones", [
        "ftrain resume RUN", "ftrain resume RUN --force --json",
    ])  # fmt: skip
    p.add_argument("run_id", type=run_id, help="the failed run")
    p.add_argument("--force", action="store_true", help="resume a run the log still thinks is running")
    json_flag(p, "the resume and what it skipped")
    p.set_defaults(entry=partial(on_the_log, load=_resume))

    p = command(sub, "fail", "record a failure or preemption", [
        "ftrain fail RUN --reason preempted", "ftrain fail RUN --reason oom --exit-code 137 --message 'rank 3'",
    ])  # fmt: skip
    p.add_argument("run_id", type=run_id, help="the running run")
    p.add_argument(
        "--reason", choices=FAILURE_REASONS, default="preempted", help="why it stopped (default preempted)"
    )
    p.add_argument("--exit-code", type=int_in(INT64_MIN, INT64_MAX), help="the job's exit code, if known")
    p.add_argument("--message", default="", help="free text kept with the failure")
    json_flag(p, "the failure")
    p.set_defaults(entry=partial(on_the_log, load=_fail))

    p = command(sub, "complete", "record completion and cost", [
        "ftrain complete RUN", "ftrain complete RUN --cost-gpu-hours 12.5 --json",
    ])  # fmt: skip
    p.add_argument("run_id", type=run_id, help="the running run")
    p.add_argument(
        "--cost-gpu-hours",
        dest="cost_hours",
        type=amount,
        help="the cost to record, in the run's unit (GPU-hours; a CPU job's CPU- or node-hours); default: "
        "running wall time × what it was launched with",
    )
    json_flag(p, "the completion")
    p.set_defaults(entry=partial(on_the_log, load=_complete))


def _checkpoint() -> Command:
    from ftrain.cli.commands import prepare_checkpoint, run_checkpoint

    return Command(prepare_checkpoint, run_checkpoint)


def _resume() -> Command:
    from ftrain.cli.commands import run_resume

    return Command(nothing, run_resume)


def _fail() -> Command:
    from ftrain.cli.commands import run_fail

    return Command(nothing, run_fail)


def _complete() -> Command:
    from ftrain.cli.commands import run_complete

    return Command(nothing, run_complete)

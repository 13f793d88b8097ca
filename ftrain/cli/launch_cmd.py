"""`ftrain launch` and `ftrain run`: their parser, and the entry that loads the launcher (`cli/launch.py`,
the supervisor with it) only when one of them runs."""

import argparse
import os
from functools import partial

from ftrain.cli.arguments import (
    MAX_HANG_TIMEOUT,
    Subparsers,
    amount,
    command,
    count,
    int_in,
    json_flag,
    positive,
    project,
    run_id,
)
from ftrain.cli.log_command import Command, on_the_log
from ftrain.events.lease_record import DEFAULT_TTL, MAX_TTL, MIN_TTL
from ftrain.events.schema import MAX_CPUS_PER_NODE, MAX_GPUS_PER_NODE, MAX_NODES
from ftrain.supervise.launch_spec import STRATEGIES


def add_parser(sub: Subparsers) -> None:
    """`launch` and `run`."""
    p = command(sub, "launch", "record a launch and print each host's torchrun command", [
        "ftrain launch P --nodes 2 --gpus-per-node 4 --nodelist 'node[07-08]' -- train.py --lr 3e-4",
        "ftrain launch P --nodes 1 --nproc-per-node 4 --strategy ddp --json",
    ])  # fmt: skip
    _add_launch_arguments(p)
    json_flag(p, "the launch")
    p.set_defaults(entry=partial(on_the_log, load=_launcher))

    p = command(sub, "run", "launch (or relaunch a failed --run-id) and supervise it: retry, resume, record", [
        "ftrain run P --nodes 1 --gpus-per-node 8 --checkpoint-every 1h30m -- train.py",
        "ftrain run P --nodes 1 --nproc-per-node 2 --strategy ddp --max-retries 5 -- -m mypkg.train",
        "RUN=$(ftrain run P --nodes 1 --gpus-per-node 8 --json -- train.py | tail -1 | jq -r .run_id)",
    ], "The training processes' own output is theirs: with --json the last stdout line is ftrain's object.")  # fmt: skip
    _add_launch_arguments(p)
    p.add_argument("--max-retries", type=count, default=3, help="relaunches after a failure (default 3)")
    p.add_argument(
        "--backoff",
        type=amount,
        default=5.0,
        metavar="SECONDS",
        help="wait before the first relaunch, doubled per failure up to 60 s (default 5)",
    )
    p.add_argument(
        "--max-restarts", type=count, default=0, help="torchrun's own in-place worker restarts (default 0)"
    )
    p.add_argument(
        "--min-nodes",
        type=int_in(1, MAX_NODES),
        help="after a node is lost, relaunch without it while this many are left (default: --nodes: wait "
        "for it); the trainer resumes resharded to the smaller world, and a later relaunch takes the node back "
        "once it answers again",
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
        type=int_in(MIN_TTL, MAX_TTL),
        default=DEFAULT_TTL,
        metavar="SECONDS",
        help=f"the supervisor's lease on the run, renewed every third of it (default {DEFAULT_TTL}): a "
        "relaunch (ftrain run --run-id X) finding it expired records the run failed (lost) and takes over, "
        "within this long of the supervisor's death; while it is renewed a second supervisor is refused",
    )
    p.add_argument(
        "--hang-timeout",
        type=int_in(1, MAX_HANG_TIMEOUT),
        metavar="SECONDS",
        help="end an attempt none of whose ranks finished a step for this long (a hung collective, a "
        "stopped node) as failed (hang) and relaunch it; a rank saving a checkpoint gets 10 times as "
        "long; e.g. --hang-timeout 600 (default: off)",
    )
    json_flag(p, "the outcome (run id, state, last attempt, exit code)")
    p.set_defaults(entry=_run)


def _add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """What `launch` and `run` both take: the project, the allocation, the strategy and the run id."""
    p.add_argument(
        "project", type=project, help="the project the run belongs to (part of the default run id)"
    )
    p.add_argument("--nodes", type=int_in(1, MAX_NODES), required=True, help="nodes the job spans")
    p.add_argument(
        "--gpus-per-node",
        type=int_in(1, MAX_GPUS_PER_NODE),
        help="GPUs per node, one process each; leave it out for a CPU job (costed in node-hours)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int_in(1, MAX_GPUS_PER_NODE),
        help="processes per node (default: --gpus-per-node; a CPU job: 1)",
    )
    p.add_argument(
        "--cpus-per-node",
        type=int_in(1, MAX_CPUS_PER_NODE),
        help="a CPU job: the CPUs it holds per node, to cost it in CPU-hours instead of node-hours",
    )
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        help="how the job shards its model, named in the default run id when given (default: built and recorded "
        "as fsdp)",
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
        type=int_in(1, 65535),
        help="torchrun's rendezvous port (default 29500; inside a Slurm or PBS job 20000 + the job id mod 10000, "
        "so jobs sharing a node never share a rendezvous)",
    )
    p.add_argument(
        "--run-id",
        type=run_id,
        help="the run's id (default dist-PROJECT-NODESxPROCS, then -STRATEGY when --strategy is given, "
        "-2, -3… when taken; inside a Slurm job PROJECT-slurm-$SLURM_JOB_ID, a PBS job "
        "PROJECT-pbs-JOBNUMBER, so a requeued job resumes it); `run`: an existing failed one is relaunched",
    )
    p.add_argument("--tp", type=positive, default=1, help="megatron tensor-parallel size")
    p.add_argument("--pp", type=positive, default=1, help="megatron pipeline-parallel size")
    p.add_argument("--deepspeed-config", default="ds_config.json", help="zero: DeepSpeed config path")


def _launcher() -> Command:
    from ftrain.cli.launch import prepare_launch, run_launch

    return Command(prepare_launch, run_launch)


def _run(args: argparse.Namespace) -> int:
    from ftrain.cli.launch import supervise
    from ftrain.cli.log_server import log_ready

    return supervise(args, lambda: log_ready(args.command, os.environ))

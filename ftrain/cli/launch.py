"""`ftrain launch` and `ftrain run`: check the allocation and the command before anything is written, record
the launch (or check a relaunch), and for `run` supervise the attempts."""

import argparse
import asyncio
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypeVar

import msgspec

from ftrain import settings
from ftrain.cadence import parse_checkpoint_every
from ftrain.cli import render
from ftrain.errors import Refused, UsageError
from ftrain.events.run_id import RUN_ID_MAX, InvalidRunId, validate_run_id
from ftrain.events.schema import Completed, InvalidEvent, Launched, encode_event
from ftrain.projections.lifecycle import IllegalTransition, check_relaunch
from ftrain.service import RunService, checkpoint_storage
from ftrain.supervise.attempts import attempt_commands, child_env
from ftrain.supervise.hostlist import HostlistError, resolve_allocation
from ftrain.supervise.launch_spec import DEFAULT_TRAIN_CMD, LaunchSpec, LaunchSpecError, build_command
from ftrain.supervise.node_exec import TemplateError, parse_template
from ftrain.supervise.opening import NotOpened, append_relaunch, open_attempt
from ftrain.supervise.supervisor import Relaunches, Supervisor
from ftrain.workers.checkpoint_dir import uri_path
from ftrain.workers.layout import run_dir
from ftrain.workers.storage.open import is_object_storage

T = TypeVar("T")


# -- launch ------------------------------------------------------------------------------------------------


class LaunchPlan(NamedTuple):
    """Everything `launch` decided before touching the log."""

    base_id: str
    explicit: bool
    make: Callable[[str], Launched]
    spec: Callable[[str], LaunchSpec]
    hosts: tuple[str, ...]


def prepare_launch(args: argparse.Namespace) -> LaunchPlan:
    """Resolve the allocation, parse --checkpoint-every and build the command; any mistake is a usage error."""
    env = os.environ
    try:
        allocation = resolve_allocation(args.nodelist, env, args.nodes)
        cadence = parse_checkpoint_every(args.checkpoint_every) if args.checkpoint_every else None
    except (HostlistError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    base_id = args.run_id or f"dist-{args.project}-{args.nodes}x{args.gpus_per_node}-{args.strategy}"
    try:
        validate_run_id(base_id if args.run_id else base_id + "-99")
    except InvalidRunId as exc:
        raise UsageError(f"{exc} (shorten the project name or pass --run-id; at most {RUN_ID_MAX})") from exc
    storage = checkpoint_storage(env).root

    def spec(run_id: str) -> LaunchSpec:
        return LaunchSpec(
            run_id=run_id,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            strategy=args.strategy,
            rdzv_host=allocation.rank0_host,
            rdzv_port=args.rdzv_port,
            train_cmd=tuple(args.train_cmd) or DEFAULT_TRAIN_CMD,
            tensor_parallel=args.tp,
            pipeline_parallel=args.pp,
            deepspeed_config=args.deepspeed_config,
        )

    try:
        build_command(spec(base_id))
    except LaunchSpecError as exc:
        raise UsageError(str(exc)) from exc

    def make(run_id: str) -> Launched:
        launch = spec(run_id)
        return Launched(
            run_id=run_id,
            project=args.project,
            strategy=args.strategy,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            hosts=allocation.hosts,
            allocation_source=allocation.source,
            rdzv_endpoint=f"{launch.rdzv_host}:{launch.rdzv_port}",
            command=tuple(build_command(launch)),
            storage=storage,
            dataset_revision=args.dataset_revision,
            checkpoint_policy=cadence,
            mlflow_run_id=env.get("MLFLOW_RUN_ID") or None,
        )

    try:
        encode_event(make(base_id))  # a command too long for the log is bad input, refused before a write
    except InvalidEvent as exc:
        raise UsageError(str(exc)) from exc
    return LaunchPlan(base_id, bool(args.run_id), make, spec, allocation.hosts)


async def append_launched(app: RunService, plan: LaunchPlan) -> Launched:
    """Append `launched` under the default id (or the next free `-N`) or the explicit --run-id, and say so."""

    def candidates() -> list[str]:
        if plan.explicit:
            return [plan.base_id]
        return [plan.base_id] + [f"{plan.base_id}-{n}" for n in range(2, 100)]

    event = await app.launch(plan.make, candidates)
    render.emit(render.launched(event))
    return event


async def run_launch(app: RunService, args: argparse.Namespace, plan: LaunchPlan) -> int:
    """Record the launch; the user runs the printed command."""
    await append_launched(app, plan)
    return 0


# -- run: launch, then supervise ------------------------------------------------------------------------------


class RunPlan(NamedTuple):
    """Everything `run` decided before touching the log or starting a process."""

    launch: LaunchPlan
    spec: Callable[[str], LaunchSpec]
    relaunches: Relaunches
    torchrun: str
    slurm: bool
    min_nodes: int
    """The fewest nodes a relaunch may go on with (`--nodes` unless `--min-nodes` says fewer)."""


def prepare_run(args: argparse.Namespace) -> RunPlan:
    """`launch`'s checks, plus the supervisor's: a torchrun to start, and srun when the job spans nodes."""
    launch = prepare_launch(args)
    if args.node_exec is not None:
        try:
            parse_template(args.node_exec)
        except TemplateError as exc:
            raise UsageError(str(exc)) from exc
        if len(launch.hosts) < args.nodes:
            raise UsageError(
                f"--node-exec starts one torchrun per host: --nodes {args.nodes} needs as many hosts "
                f"(--nodelist, or a scheduler's allocation), found {', '.join(launch.hosts)}"
            )
    slurm = args.nodes > 1 and args.node_exec is None
    if slurm and not os.environ.get("SLURM_JOB_ID"):
        raise UsageError(
            f"--nodes {args.nodes} needs a Slurm allocation (SLURM_JOB_ID is not set) or --node-exec (how to "
            "start a command on a node, e.g. 'ssh {host}'); outside both use --nodes 1"
        )
    if slurm and shutil.which("srun") is None:
        raise UsageError("srun not found on PATH")
    min_nodes = args.nodes if args.min_nodes is None else args.min_nodes
    if min_nodes > args.nodes:
        raise UsageError(f"--min-nodes {min_nodes} is more than --nodes {args.nodes}")
    torchrun = shutil.which("torchrun") or shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        raise UsageError("torchrun not found on PATH or beside this Python (is torch installed?)")

    def spec(run_id: str) -> LaunchSpec:
        return msgspec.structs.replace(
            launch.spec(run_id),
            gpus_per_node=args.nproc_per_node or args.gpus_per_node,
            max_restarts=args.max_restarts,
        )

    try:
        for nodes in range(min_nodes, args.nodes + 1):  # every world an elastic relaunch may train in
            build_command(msgspec.structs.replace(spec(launch.base_id), nodes=nodes))
    except LaunchSpecError as exc:
        raise UsageError(str(exc)) from exc
    return RunPlan(
        launch,
        spec,
        Relaunches(max_retries=args.max_retries, backoff=args.backoff),
        torchrun,
        slurm,
        min_nodes,
    )


async def start_run(app: RunService, args: argparse.Namespace, plan: RunPlan) -> tuple[Launched, int]:
    """Append `launched` for a new run (attempt 1); an existing --run-id is relaunched, as launched, after a
    failure only, by opening its next attempt (of two racing relaunches, one opens it; the other is refused).
    Returns the launch and the attempt to start."""
    if plan.launch.explicit:
        await app.projector.catch_up()
        if await app.model.taken(plan.launch.base_id):
            state = await app.state_of(plan.launch.base_id)
            try:
                check_relaunch(
                    state,
                    project=args.project,
                    nodes=args.nodes,
                    gpus_per_node=args.gpus_per_node,
                    strategy=args.strategy,
                )
                opened = await append_relaunch(app.store, state.run_id, plan.launch.hosts)
            except (IllegalTransition, NotOpened) as exc:
                raise Refused(str(exc)) from exc
            render.emit(
                f"Relaunching {state.run_id} — failure {state.failures} (last: {state.last_failure}), "
                f"step {state.step}, {state.resume_count} resume(s) so far"
            )
            return state.launch, opened.attempt
    return await append_launched(app, plan.launch), 1


def supervise(args: argparse.Namespace) -> int:
    """`ftrain run`: check everything, record the launch (or check the relaunch), then supervise attempts."""
    from ftrain.workers.recorder import Recorder

    plan = prepare_run(args)
    launched, attempt = asyncio.run(_with_app(lambda app: start_run(app, args, plan)))
    run_id = launched.run_id
    ckpt_dir: Path | str = (
        f"{launched.storage.rstrip('/')}/{run_id}"
        if is_object_storage(launched.storage)
        else run_dir(uri_path(launched.storage), run_id)
    )
    command = attempt_commands(plan.spec(run_id), plan.torchrun, slurm=plan.slurm, node_exec=args.node_exec)
    env = child_env(os.environ, run_id, ckpt_dir)
    nats = settings.nats(os.environ)
    recorder = Recorder(run_id, nats)
    try:
        outcome = Supervisor(
            run_id,
            command,
            env,
            ckpt_dir,
            plan.relaunches,
            recorder,
            attempt=attempt,
            opener=partial(open_attempt, run_id, nats),
            hosts=plan.launch.hosts,
            min_nodes=plan.min_nodes,
        ).run()
    finally:
        recorder.close()
    if outcome.status != "completed":
        sys.stderr.write(f"ftrain run: {outcome.message}\n")
        return outcome.exit_code
    if not outcome.recorded:
        render.emit(f"Completed {run_id} — kept in the local outbox until the event log is reachable")
        return 0
    render.emit(asyncio.run(_with_app(lambda app: _completion(app, run_id))))
    return 0


async def _completion(app: RunService, run_id: str) -> str:
    """The completion line, with the GPU-hours the log computed."""
    entries = await app.timeline(run_id)
    done = next((e.event for e in reversed(entries) if isinstance(e.event, Completed)), None)
    if done is None:
        state = await app.state_of(run_id)
        raise Refused(
            f"run {run_id} finished, but the log did not accept its completion (it is {state.status})"
        )
    return render.completed(done)


async def _with_app(use: Callable[[RunService], Awaitable[T]]) -> T:
    async with RunService.open() as app:
        return await use(app)

"""`ftrain launch` and `ftrain run`: check the allocation and the command before anything is written, record
the launch (or check a relaunch), and for `run` supervise the attempts. Their parser: `launch_cmd`."""

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from ftrain import settings
from ftrain.cadence import parse_checkpoint_every
from ftrain.cli import documents, render
from ftrain.domain.lifecycle import IllegalTransition, check_owner, check_relaunch
from ftrain.errors import Refused, UsageError
from ftrain.events.lease_record import Holder
from ftrain.events.log_port import LogUnavailable
from ftrain.events.run_id import RUN_ID_MAX, InvalidRunId, validate_run_id
from ftrain.events.schema import Completed, InvalidEvent, Launched, SchedulerJob, encode_event
from ftrain.service import RunService
from ftrain.service.run_commands import checkpoint_storage
from ftrain.supervise.attempts import attempt_commands, child_env
from ftrain.supervise.fencing import claim_opened
from ftrain.supervise.hostlist import HostlistError, resolve_allocation
from ftrain.supervise.launch_spec import (
    DEFAULT_STRATEGY,
    DEFAULT_TRAIN_CMD,
    LaunchSpec,
    LaunchSpecError,
    build_command,
)
from ftrain.supervise.lease_keeper import LeaseKeeper, this_supervisor
from ftrain.supervise.node_exec import TemplateError, parse_template
from ftrain.supervise.node_return import node_probe
from ftrain.supervise.open_attempt import NotOpened, append_relaunch, open_attempt
from ftrain.supervise.scheduler_job import (
    NotAJob,
    current_job,
    ended_by_hand,
    identified,
    identity_command,
    job_run_id,
    made_progress,
    may_resume,
    recorded_jobs,
    rendezvous_port,
    requeue_command,
    state_command,
)
from ftrain.supervise.supervisor import Relaunches, Supervisor
from ftrain.supervise.watchdog import progress_root
from ftrain.trackers.configured import lifecycle_feed, mlflow_run
from ftrain.trackers.identity import tracker_env
from ftrain.workers.layout import run_dir
from ftrain.workers.storage.location import uri_path
from ftrain.workers.storage.open import is_object_storage
from ftrain.workers.storage.storage_errors import Fenced, StorageError, StorageUnavailable

T = TypeVar("T")
REQUEUE_TIMEOUT = 60.0
SHOW_TIMEOUT = 10.0
"""Seconds `scontrol show job` may take at a job's start before its start time counts as unknown."""


# -- launch ------------------------------------------------------------------------------------------------


class LaunchPlan(NamedTuple):
    """Everything `launch` decided before touching the log."""

    base_id: str
    explicit: bool
    make: Callable[[str], Launched]
    spec: Callable[[str], LaunchSpec]
    hosts: tuple[str, ...]
    job: SchedulerJob | None = None
    """The Slurm or PBS job this runs in (its id names the run when --run-id is not given)."""
    procs_per_node: int = 1
    """What the launch records as `gpus_per_node`: GPUs, or a CPU job's processes per node."""
    derived: bool = False
    """The run id is the job's (no --run-id): a start that finds the run resumes it only as its requeue."""


def prepare_launch(args: argparse.Namespace) -> LaunchPlan:
    """Resolve the allocation, parse --checkpoint-every and build the command; any mistake is a usage error."""
    env = os.environ
    try:
        allocation = resolve_allocation(args.nodelist, env, args.nodes)
        cadence = parse_checkpoint_every(args.checkpoint_every) if args.checkpoint_every else None
    except (HostlistError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    procs, devices = processes_per_node(args)
    try:
        job = current_job(env)
        derived = job_run_id(args.project, job) if job is not None and not args.run_id else None
    except NotAJob as exc:
        raise UsageError(str(exc)) from exc
    job = identify(job)
    explicit = args.run_id or derived  # a requeued job's run is the job's: resumed, never a new -N
    strategy = args.strategy or DEFAULT_STRATEGY
    named = f"-{args.strategy}" if args.strategy else ""  # the script's strategy is known only when named
    base_id = explicit or f"dist-{args.project}-{args.nodes}x{procs}{named}"
    try:
        validate_run_id(base_id if explicit else base_id + "-99")
    except InvalidRunId as exc:
        raise UsageError(f"{exc} (shorten the project name or pass --run-id; at most {RUN_ID_MAX})") from exc
    storage = checkpoint_storage(env)

    def spec(run_id: str) -> LaunchSpec:
        return LaunchSpec(
            run_id=run_id,
            nodes=args.nodes,
            gpus_per_node=args.nproc_per_node or procs,
            strategy=strategy,
            rdzv_host=allocation.rank0_host,
            rdzv_port=args.rdzv_port if args.rdzv_port is not None else rendezvous_port(job),
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
            strategy=strategy,
            nodes=args.nodes,
            gpus_per_node=procs,
            devices=devices,
            cpus_per_node=args.cpus_per_node or UNSET,
            hosts=allocation.hosts,
            allocation_source=allocation.source,
            rdzv_endpoint=f"{launch.rdzv_host}:{launch.rdzv_port}",
            command=tuple(build_command(launch)),
            storage=storage,
            dataset_revision=args.dataset_revision,
            checkpoint_policy=cadence,
            mlflow_run_id=env.get("MLFLOW_RUN_ID") or None,
            job=job or UNSET,
        )

    try:
        encode_event(make(base_id))  # a command too long for the log is bad input, refused before a write
    except InvalidEvent as exc:
        raise UsageError(str(exc)) from exc
    return LaunchPlan(base_id, bool(explicit), make, spec, allocation.hosts, job, procs, derived is not None)


def identify(job: SchedulerJob | None) -> SchedulerJob | None:
    """`job` with what the scheduler shows of this start (Slurm's start time; PBS's run count and start time:
    what tells a requeue, or a second `ftrain run` within one job start, from a new job with a recycled id);
    as it is when the scheduler cannot say in time."""
    if job is None:
        return job
    try:
        shown = subprocess.run(
            identity_command(job), capture_output=True, text=True, timeout=SHOW_TIMEOUT, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return job
    return identified(job, shown)


def processes_per_node(args: argparse.Namespace) -> tuple[int, Literal["cpu"] | UnsetType]:
    """What the launch records per node: one process per GPU, or a CPU job's processes (--nproc-per-node,
    default 1) when no --gpus-per-node is given; and whether it is a CPU job."""
    if args.gpus_per_node is None:
        return args.nproc_per_node or 1, "cpu"
    if args.cpus_per_node is not None:
        raise UsageError("--cpus-per-node costs a CPU job: leave --gpus-per-node out")
    return args.gpus_per_node, UNSET


async def append_launched(app: RunService, plan: LaunchPlan, mlflow_run_id: str | None = None) -> Launched:
    """Append `launched` under the default id (or the next free `-N`) or the explicit --run-id, and say so;
    `mlflow_run_id`: the MLflow run its attempts continue (None: the user's `MLFLOW_RUN_ID`, if any)."""

    def candidates() -> list[str]:
        if plan.explicit:
            return [plan.base_id]
        return [plan.base_id] + [f"{plan.base_id}-{n}" for n in range(2, 100)]

    def make(run_id: str) -> Launched:
        launched = plan.make(run_id)
        return msgspec.structs.replace(launched, mlflow_run_id=mlflow_run_id or launched.mlflow_run_id)

    event = await app.launch(make, candidates)
    render.emit(render.launched(event))
    return event


async def run_launch(app: RunService, args: argparse.Namespace, plan: LaunchPlan) -> int:
    """Record the launch; the user runs the printed command."""
    event = await append_launched(app, plan)
    if args.json:
        render.emit_json(documents.launched(event))
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
    save: tuple[signal.Signals, ...] = ()
    """The signals the trainer saves on (FTRAIN_SAVE_SIGNALS): each node's torchrun then runs under the relay."""


def prepare_run(args: argparse.Namespace) -> RunPlan:
    """`launch`'s checks, plus the supervisor's: a training command (never the reference trainer by default:
    a forgotten `--` would train a model nobody asked for), a torchrun to start, and srun when the job spans
    nodes."""
    if not args.train_cmd:
        raise UsageError(
            "no training command: put it after `--` (`-- train.py --lr 3e-4`, `-- -m mypkg.train`; the "
            "reference trainer: `-- -m ftrain.examples.train`)"
        )
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
    if args.requeue_on_failure and launch.job is None:
        raise UsageError("--requeue-on-failure needs a Slurm job (SLURM_JOB_ID) or a PBS job (PBS_JOBID)")
    min_nodes = args.nodes if args.min_nodes is None else args.min_nodes
    if min_nodes > args.nodes:
        raise UsageError(f"--min-nodes {min_nodes} is more than --nodes {args.nodes}")
    torchrun = shutil.which("torchrun") or shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        raise UsageError("torchrun not found on PATH or beside this Python (is torch installed?)")
    if args.hang_timeout is not None:
        progress_root()  # made or refused (UnsafeDirectory: exit 2) before the log is touched

    def spec(run_id: str) -> LaunchSpec:
        return msgspec.structs.replace(
            launch.spec(run_id),
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
        settings.save_signals(os.environ),
    )


def checkpoint_dir(launched: Launched) -> Path | str:
    """The run's checkpoint location as the supervisor hands it to the trainer: a directory, or `s3://…`."""
    if is_object_storage(launched.storage):
        return f"{launched.storage.rstrip('/')}/{launched.run_id}"
    return run_dir(uri_path(launched.storage), launched.run_id)


class Started(NamedTuple):
    """What `start_run` opened: the launch, the attempt to start, the lease's revision, whether the log
    held a checkpoint of the run (a relaunch: its location must then be found, never made afresh), and the
    MLflow run every attempt continues (None: none)."""

    launched: Launched
    attempt: int
    revision: int
    vouched: bool = False
    mlflow_run_id: str | None = None


async def start_run(app: RunService, args: argparse.Namespace, plan: RunPlan, holder: Holder) -> Started:
    """Append `launched` for a new run (attempt 1); an existing --run-id is relaunched, as launched, after a
    failure only, by opening its next attempt (of two racing relaunches, one opens it; the other is refused).
    Another user's run, or the run a job's id derives met by no requeue of that job, is refused before
    anything is written (`relaunch_refusal`). Either way `holder` takes the run's supervisor lease first; a
    relaunch finding the lease of a dead supervisor records its run `failed` (lost) and goes on
    (`RunService.claim`)."""
    if plan.launch.explicit:
        await app.projector.catch_up()
        if await app.model.taken(plan.launch.base_id):
            if refusal := await relaunch_refusal(app, plan.launch, holder.user):
                raise Refused(refusal)
            claim = await app.claim(plan.launch.base_id, holder)
            if claim.lost is not None:
                render.emit(f"Took {claim.lost.run_id} over: {claim.lost.message} (recorded as failed: lost)")
            state = await app.state_of(plan.launch.base_id)
            wanted = plan.launch.make(state.run_id)
            try:
                check_relaunch(
                    state,
                    user=holder.user,
                    project=args.project,
                    gpus_per_node=plan.launch.procs_per_node,
                    strategy=wanted.strategy,
                    dataset_revision=wanted.dataset_revision,
                    checkpoint_policy=wanted.checkpoint_policy,
                )
                # the fence first: a dead or stopped supervisor's attempt may still be saving, and must seal
                # nothing from the moment the log opens the next (of two racing relaunches both claim it)
                vouched = bool(state.valid_checkpoints())
                claim_opened(checkpoint_dir(state.launch), state.attempt + 1, vouched=vouched)
                tracked = mlflow_run(os.environ, state.mlflow_run_id, state.run_id)
                opened = await append_relaunch(
                    app.store, state.run_id, plan.launch.hosts, plan.launch.job, tracked
                )
            except (IllegalTransition, NotOpened) as exc:
                await app.release(state.run_id, claim.revision)
                raise Refused(str(exc)) from exc
            except (StorageUnavailable, StorageError, Fenced, OSError) as exc:
                await app.release(state.run_id, claim.revision)
                raise Refused(
                    f"run {state.run_id} not relaunched: its checkpoints cannot be fenced: {exc}"
                ) from exc
            render.emit(
                f"Relaunching {state.run_id} — failure {state.failures} (last: {state.last_failure}), "
                f"step {state.step}, {state.resume_count} resume(s) so far"
            )
            return Started(state.launch, opened.attempt, claim.revision, opened.checkpoint_seq > 0, tracked)
    launched = await append_launched(app, plan.launch, mlflow_run(os.environ, None, plan.launch.base_id))
    revision = await app.take_lease(launched.run_id, msgspec.structs.replace(holder, attempt=1))
    return Started(launched, 1, revision, mlflow_run_id=launched.mlflow_run_id)


async def relaunch_refusal(app: RunService, launch: LaunchPlan, user: str) -> str | None:
    """Why the existing run `launch` names may not be relaunched or taken over at all, checked before its lease
    is claimed (a claim records a dead supervisor's run failed): it is another user's, or its id is the job's
    and this job start is no requeue of the job that started it (`may_resume`). None: go on."""
    state = await app.state_of(launch.base_id)
    try:
        check_owner(state, user)
    except IllegalTransition as exc:
        return str(exc)
    if not launch.derived or launch.job is None:
        return None
    events = [entry.event for entry in await app.timeline(state.run_id) if entry.event is not None]
    return may_resume(recorded_jobs(events), launch.job, state.run_id)


def supervise(args: argparse.Namespace, ready: Callable[[], None]) -> int:
    """`ftrain run`: check everything, record the launch (or check the relaunch), then supervise attempts."""
    from ftrain.workers.recorder import Recorder

    plan = prepare_run(args)
    ready()  # the embedded server, started (and said so) only now that the input is known good
    holder = this_supervisor(args.lease_ttl)
    launched, attempt, revision, vouched, tracked = asyncio.run(
        _with_app(lambda app: start_run(app, args, plan, holder))
    )
    run_id = launched.run_id
    ckpt_dir = checkpoint_dir(launched)
    command = attempt_commands(
        plan.spec(run_id), plan.torchrun, slurm=plan.slurm, node_exec=args.node_exec, relayed=bool(plan.save)
    )
    policy = launched.checkpoint_policy
    env = child_env(
        os.environ,
        run_id,
        ckpt_dir,
        checkpoint_every=policy.text if policy is not None else None,
        dataset_revision=launched.dataset_revision,
    ) | tracker_env(os.environ, run_id, tracked)
    nats = settings.nats(os.environ)
    recorder = Recorder(run_id, nats)
    lease = LeaseKeeper(run_id, nats, msgspec.structs.replace(holder, attempt=attempt), revision).start()
    feed = lifecycle_feed(os.environ, run_id, tracked)
    try:
        supervisor = Supervisor(
            run_id,
            command,
            env,
            ckpt_dir,
            plan.relaunches,
            recorder,
            attempt=attempt,
            opener=partial(open_attempt, run_id, nats, job=plan.launch.job, mlflow_run_id=tracked),
            hosts=plan.launch.hosts,
            min_nodes=plan.min_nodes,
            probe=node_probe(slurm=plan.slurm, node_exec=args.node_exec),
            lease=lease,
            hang_timeout=args.hang_timeout,
            save_signals=plan.save,
            requeue=args.requeue_on_failure,
            vouched=vouched,
        )
        outcome = supervisor.run()
    finally:
        lease.close(release=True)  # a lease lost to another supervisor is not released
        recorder.close()
        if feed is not None:
            feed.close()  # after the recorder: the tracker gets the run's last events too
    completion = None
    if outcome.status != "completed":
        sys.stderr.write(f"ftrain run: {outcome.message}\n")
        if args.requeue_on_failure and plan.launch.job is not None:
            requeue_if_progressed(plan.launch.job, run_id)
    elif not outcome.recorded:
        render.emit(f"Completed {run_id} — kept in the local outbox until the event log is reachable")
    else:
        done, unit = asyncio.run(_with_app(lambda app: _completion(app, run_id)))
        render.emit(render.completed(done, unit))
        completion = documents.completed(done, unit)
    if args.json:
        render.emit_json(documents.run_outcome(run_id, outcome, supervisor.number, completion))
    return outcome.exit_code


def requeue_if_progressed(job: SchedulerJob, run_id: str) -> bool:
    """`requeue` the failed job start `job` of `run_id` only when it recorded a checkpoint of the run: one that
    saved nothing would fail the same way on every requeue (nor when the log cannot say). One line says why
    not; False when not requeued."""
    try:
        events = asyncio.run(_with_app(lambda app: app.timeline(run_id)))
    except (Refused, LogUnavailable, OSError) as exc:
        sys.stderr.write(
            f"ftrain run: not requeueing {job.scheduler} job {job.id}: progress unknown ({exc})\n"
        )
        return False
    if not made_progress([e.event for e in events if e.event is not None], job):
        sys.stderr.write(
            f"ftrain run: not requeueing {job.scheduler} job {job.id}: this job start recorded no checkpoint "
            f"of {run_id}, so a requeue would fail the same way; fix the cause, then resubmit\n"
        )
        return False
    return requeue(job)


def requeue(job: SchedulerJob) -> bool:
    """Ask the scheduler to requeue `job` (`scontrol requeue`, PBS's `qrerun`): it starts again on a fresh
    allocation and its `ftrain run` resumes the run. One line says what happened; False when refused."""
    argv, ask = requeue_command(job), state_command(job)
    try:
        if ask is not None and ended_by_hand(_output(ask)):
            render.emit(f"Not requeueing {job.scheduler} job {job.id}: it is being cancelled")
            return False
        render.emit(f"Requeueing {job.scheduler} job {job.id}: {' '.join(argv)}")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=REQUEUE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        sys.stderr.write(f"ftrain run: {argv[0]} failed: {exc}\n")
        return False
    if done.returncode != 0:
        sys.stderr.write(f"ftrain run: {' '.join(argv)} refused: {done.stderr.strip() or done.returncode}\n")
    return done.returncode == 0


def _output(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=REQUEUE_TIMEOUT, check=False).stdout


async def _completion(app: RunService, run_id: str) -> tuple[Completed, str]:
    """The run's `completed` event, with the cost the log computed, and the unit of that cost."""
    entries = await app.timeline(run_id)
    done = next((e.event for e in reversed(entries) if isinstance(e.event, Completed)), None)
    if done is None:
        state = await app.state_of(run_id)
        raise Refused(
            f"run {run_id} finished, but the log did not accept its completion (it is {state.status})"
        )
    return done, (await app.state_of(run_id)).cost_unit


async def _with_app(use: Callable[[RunService], Awaitable[T]]) -> T:
    async with RunService.open(leases=True) as app:
        return await use(app)

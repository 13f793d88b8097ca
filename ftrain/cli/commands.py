"""Each CLI command in two halves: `prepare` checks the input before anything connects or writes (a usage
error leaves no trace), `run` executes it against the service and prints the result."""

import argparse
import asyncio
import json
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from events.run_id import RUN_ID_MAX, InvalidRunId, validate_run_id
from events.schema import Completed, CorruptSkipped, Launched, now
from ftrain.cadence import parse_policy
from ftrain.cli import render
from ftrain.errors import Refused, UsageError
from ftrain.service import Ftrain, checkpoint_storage
from ftrain.supervise.hostlist import HostlistError, resolve_allocation
from ftrain.supervise.launch_spec import DEFAULT_TRAIN_CMD, LaunchSpec, LaunchSpecError, build_command
from ftrain.supervise.supervisor import RetryPolicy, Supervisor, attempt_commands, child_env
from projections.lifecycle import RunState
from workers.checkpoint_dir import path_uri, uri_path
from workers.layout import RESERVED, run_dir

T = TypeVar("T")


class Command(NamedTuple):
    """The two halves of a command."""

    prepare: Callable[[argparse.Namespace], Any]
    run: Callable[[Ftrain, argparse.Namespace, Any], Awaitable[int]]


def _nothing(args: argparse.Namespace) -> None:
    return None


# -- launch ------------------------------------------------------------------------------------------------


class LaunchPlan(NamedTuple):
    """Everything `launch` decided before touching the log."""

    base_id: str
    explicit: bool
    make: Callable[[str], Launched]
    spec: Callable[[str], LaunchSpec]
    hosts: tuple[str, ...]


def prepare_launch(args: argparse.Namespace) -> LaunchPlan:
    """Resolve the allocation, parse the policy and build the command; any mistake is a usage error."""
    env = os.environ
    try:
        allocation = resolve_allocation(args.nodelist, env, args.nodes)
        policy = parse_policy(args.checkpoint_every) if args.checkpoint_every else None
    except (HostlistError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    base_id = args.run_id or f"dist-{args.project}-{args.nodes}x{args.gpus_per_node}-{args.strategy}"
    try:
        validate_run_id(base_id if args.run_id else base_id + "-99")
    except InvalidRunId as exc:
        raise UsageError(f"{exc} (shorten the project name or pass --run-id; at most {RUN_ID_MAX})") from exc
    storage = path_uri(checkpoint_storage(env))

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
            checkpoint_policy=policy,
            mlflow_run_id=env.get("MLFLOW_RUN_ID") or None,
        )

    return LaunchPlan(base_id, bool(args.run_id), make, spec, allocation.hosts)


async def append_launched(app: Ftrain, plan: LaunchPlan) -> Launched:
    """Append `launched` under the default id (or the next free `-N`) or the explicit --run-id, and say so."""

    def candidates() -> list[str]:
        if plan.explicit:
            return [plan.base_id]
        return [plan.base_id] + [f"{plan.base_id}-{n}" for n in range(2, 100)]

    event = await app.launch(plan.make, candidates)
    render.emit(render.launched(event))
    return event


async def run_launch(app: Ftrain, args: argparse.Namespace, plan: LaunchPlan) -> int:
    """Record the launch; the user runs the printed command."""
    await append_launched(app, plan)
    return 0


# -- run: launch, then supervise ------------------------------------------------------------------------------


class RunPlan(NamedTuple):
    """Everything `run` decided before touching the log or starting a process."""

    launch: LaunchPlan
    spec: Callable[[str], LaunchSpec]
    policy: RetryPolicy
    torchrun: str
    slurm: bool


def prepare_run(args: argparse.Namespace) -> RunPlan:
    """`launch`'s checks, plus the supervisor's: a torchrun to start, and srun when the job spans nodes."""
    launch = prepare_launch(args)
    slurm = args.nodes > 1
    if slurm and not os.environ.get("SLURM_JOB_ID"):
        raise UsageError(
            f"--nodes {args.nodes} needs a Slurm allocation (SLURM_JOB_ID is not set): ftrain run starts one "
            "torchrun per node through srun; outside Slurm use --nodes 1"
        )
    if slurm and shutil.which("srun") is None:
        raise UsageError("srun not found on PATH")
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
        build_command(spec(launch.base_id))
    except LaunchSpecError as exc:
        raise UsageError(str(exc)) from exc
    return RunPlan(
        launch, spec, RetryPolicy(max_retries=args.max_retries, backoff=args.backoff), torchrun, slurm
    )


async def start_run(app: Ftrain, args: argparse.Namespace, plan: RunPlan) -> Launched:
    """Append `launched` for a new run; an existing --run-id is relaunched, as launched, after a failure only."""
    if plan.launch.explicit:
        await app.projector.catch_up()
        if await app.model.taken(plan.launch.base_id):
            state = await app.run(plan.launch.base_id)
            _check_relaunch(state, args)
            render.emit(
                f"Relaunching {state.run_id} — failure {state.failures} (last: {state.last_failure}), "
                f"step {state.step}, {state.resume_count} resume(s) so far"
            )
            return state.launch
    return await append_launched(app, plan.launch)


def _check_relaunch(state: RunState, args: argparse.Namespace) -> None:
    """Only a failed run is relaunched (a running one may have its supervisor still), and only as itself."""
    if state.status == "running":
        raise Refused(
            f"run {state.run_id} is running (another supervisor?); if it is dead, record that first: "
            f"ftrain fail {state.run_id}"
        )
    if state.status == "completed":
        raise Refused(f"run {state.run_id} is completed; nothing may follow completion")
    launch = state.launch
    if (launch.project, launch.nodes, launch.gpus_per_node, launch.strategy) != (
        args.project,
        args.nodes,
        args.gpus_per_node,
        args.strategy,
    ):
        raise Refused(
            f"run {state.run_id} was launched as {launch.project} {launch.nodes}×{launch.gpus_per_node} "
            f"{launch.strategy}; relaunch it with the same project, --nodes, --gpus-per-node and --strategy"
        )


def supervise(args: argparse.Namespace) -> int:
    """`ftrain run`: check everything, record the launch (or check the relaunch), then supervise attempts."""
    from ftrain.recorder import Recorder

    plan = prepare_run(args)
    launched = asyncio.run(_with_app(lambda app: start_run(app, args, plan)))
    run_id = launched.run_id
    ckpt_dir = run_dir(uri_path(launched.storage), run_id)
    command = attempt_commands(plan.spec(run_id), plan.launch.hosts, plan.torchrun, slurm=plan.slurm)
    env = child_env(os.environ, run_id, ckpt_dir)
    recorder = Recorder(run_id, os.environ)
    try:
        outcome = Supervisor(run_id, command, env, ckpt_dir, plan.policy, recorder).run()
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


async def _completion(app: Ftrain, run_id: str) -> str:
    """The completion line, with the GPU-hours the log computed."""
    entries = await app.timeline(run_id)
    done = next((e.event for e in reversed(entries) if isinstance(e.event, Completed)), None)
    if done is None:
        state = await app.run(run_id)
        raise Refused(
            f"run {run_id} finished, but the log did not accept its completion (it is {state.status})"
        )
    return render.completed(done)


async def _with_app(use: Callable[[Ftrain], Awaitable[T]]) -> T:
    async with Ftrain.open() as app:
        return await use(app)


# -- checkpoint --------------------------------------------------------------------------------------------


def prepare_checkpoint(args: argparse.Namespace) -> list[tuple[str, bytes | Path]]:
    """Read and check the checkpoint's contents before anything is written."""
    if args.state is not None or args.state_file is not None:
        try:
            text = args.state if args.state is not None else args.state_file.read_text()
            state = json.loads(text)
        except OSError as exc:
            raise UsageError(f"--state-file {args.state_file}: {exc.strerror}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"the training state is not valid JSON ({exc})") from exc
        return [("state.json", msgspec.json.encode(state, order="sorted"))]
    return _directory_sources(args.path, args.shards)


def _directory_sources(path: Path, shards: int) -> list[tuple[str, bytes | Path]]:
    if not path.is_dir():
        raise UsageError(f"--path {path}: not a directory")
    files = sorted(p for p in path.rglob("*") if p.is_file())
    if not files:
        raise UsageError(f"--path {path}: no files")
    names = [str(p.relative_to(path)) for p in files]
    if RESERVED & set(names):
        raise UsageError(
            f"--path {path}: already holds a manifest or marker (is it a checkpoint of ftrain's?)"
        )
    dcp_shards = [n for n in names if n.endswith(".distcp")]
    if dcp_shards and len(dcp_shards) != shards:
        raise UsageError(
            f"--path {path} holds {len(dcp_shards)} .distcp shard(s) but --shards {shards} was given"
        )
    return list(zip(names, files, strict=True))


async def run_checkpoint(
    app: Ftrain, args: argparse.Namespace, sources: list[tuple[str, bytes | Path]]
) -> int:
    """Write the checkpoint, then record it."""
    event = await app.checkpoint(
        args.run_id, step=args.step, epoch=args.epoch, shards=args.shards, sources=sources
    )
    render.emit(render.checkpointed(event))
    return 0


# -- resume, fail, complete ----------------------------------------------------------------------------------


async def run_resume(app: Ftrain, args: argparse.Namespace, _: None) -> int:
    """Skip invalid checkpoints newest first and resume from the first valid one; exit 1 if none is."""

    async def announce(event: CorruptSkipped) -> None:
        render.emit(render.skipped(event))

    outcome = await app.resume(args.run_id, force=args.force, on_skip=announce)
    if outcome.resumed is None:
        total = len(outcome.state.checkpoints) if outcome.state else 0
        if total == 0:
            raise Refused(f"run {args.run_id} has no checkpoint to resume from")
        raise Refused(
            f"run {args.run_id}: no valid checkpoint ({total} recorded, all invalid); not restarting"
        )
    render.emit(render.resumed(outcome.resumed))
    return 0


async def run_fail(app: Ftrain, args: argparse.Namespace, _: None) -> int:
    """Record a failure."""
    event = await app.fail(args.run_id, reason=args.reason, exit_code=args.exit_code, message=args.message)
    render.emit(render.failed(event, await app.run(args.run_id)))
    return 0


async def run_complete(app: Ftrain, args: argparse.Namespace, _: None) -> int:
    """Record completion."""
    render.emit(render.completed(await app.complete(args.run_id, cost_gpu_hours=args.cost_gpu_hours)))
    return 0


# -- queries ---------------------------------------------------------------------------------------------------


def status_document(state: RunState) -> dict[str, Any]:
    """`status --json`: the folded state plus derived figures."""
    moment = now()
    valid = next(iter(state.valid_checkpoints()), None)
    return {
        "run_id": state.run_id,
        "project": state.project,
        "state": state.status,
        "step": state.step,
        "epoch": state.epoch,
        "last_valid_checkpoint": valid,
        "resume_count": state.resume_count,
        "failures": state.failures,
        "last_failure": state.last_failure,
        "gpu_hours": round(state.gpu_hours_at(moment), 6),
        "running_seconds": round(state.running_seconds_at(moment), 3),
        "chain_head": state.head,
        "checkpoints": state.checkpoints,
        "launch": state.launch,
    }


async def run_status(app: Ftrain, args: argparse.Namespace, _: None) -> int:
    """One run."""
    state = await app.run(args.run_id)
    if args.json:
        render.emit_json(status_document(state))
    else:
        render.emit(render.status(state, now()))
    return 0


async def run_list(app: Ftrain, args: argparse.Namespace, _: None) -> int:
    """Runs, optionally of one project."""
    states = await app.runs(args.project)
    if args.json:
        render.emit_json([status_document(s) for s in states])
        return 0
    moment = now()
    rows = [
        (
            s.run_id,
            s.project,
            s.status,
            str(s.step),
            str(s.resume_count),
            str(s.failures),
            f"{s.gpu_hours_at(moment):.2f}",
        )
        for s in states
    ]
    render.emit(render.table(("RUN", "PROJECT", "STATE", "STEP", "RESUMES", "FAILURES", "GPU-HOURS"), rows))
    return 0


async def run_cost(app: Ftrain, args: argparse.Namespace, _: None) -> int:
    """GPU-hours per run and in total."""
    states = await app.runs(args.project)
    moment = now()
    per_run = [
        (s.run_id, s.status, s.gpus, round(s.gpu_hours_at(moment), 6), s.cost_source or "so far")
        for s in states
    ]
    total = round(sum(r[3] for r in per_run), 6)
    if args.json:
        runs = [
            {"run_id": r, "state": st, "gpus": g, "gpu_hours": h, "source": src}
            for r, st, g, h, src in per_run
        ]
        render.emit_json({"project": args.project, "runs": runs, "total_gpu_hours": total})
        return 0
    rows = [(r, st, str(g), f"{h:.2f}", src) for r, st, g, h, src in per_run]
    render.emit(render.table(("RUN", "STATE", "GPUS", "GPU-HOURS", "SOURCE"), rows))
    render.emit(f"total {total:.2f} GPU-hours over {len(per_run)} run(s)")
    return 0


async def run_audit(app: Ftrain, args: argparse.Namespace, _: None) -> int:
    """Verify chains from the stream; exit 1 naming the first bad event of each broken run."""
    if args.run_id is not None:
        await app.run(args.run_id)
    report = await app.verify(args.run_id)
    if args.json:
        render.emit_json(
            {"ok": report.ok, "events": report.events, "runs": report.runs, "findings": report.findings}
        )
    else:
        for item in report.findings:
            render.emit(render.finding(item))
        verdict = "every chain intact" if report.ok else f"{len(report.findings)} broken chain(s)"
        render.emit(f"Verified {report.events} event(s) in {report.runs} run(s): {verdict}")
    return 0 if report.ok else 1


async def run_replay(app: Ftrain, args: argparse.Namespace, _: None) -> int:
    """The timeline, oldest first, or a rebuild of the read model."""
    if args.rebuild:
        applied = await app.projector.rebuild()
        render.emit(f"Rebuilt the read model from stream seq 1: {applied} event(s) applied")
        return 0
    if args.run_id is not None:
        await app.run(args.run_id)
    entries = await app.timeline(args.run_id)
    if args.json:
        render.emit_json(entries)
        return 0
    for e in entries:
        if e.event is not None:
            render.emit(
                f"#{e.stream_seq:<6} {e.event.time:%Y-%m-%d %H:%M:%S}  {e.run_id}  seq {e.event.seq:<4} "
                f"{e.event_type:<16} {render.summary(e.event)}"
            )
        elif e.finding is not None:
            render.emit(
                f"#{e.stream_seq:<6} {'?':19}  {e.run_id}  {e.event_type:<16} REJECTED: {e.finding.reason}"
            )
    return 0


COMMANDS: dict[str, Command] = {
    "launch": Command(prepare_launch, run_launch),
    "checkpoint": Command(prepare_checkpoint, run_checkpoint),
    "resume": Command(_nothing, run_resume),
    "fail": Command(_nothing, run_fail),
    "complete": Command(_nothing, run_complete),
    "status": Command(_nothing, run_status),
    "list": Command(_nothing, run_list),
    "cost": Command(_nothing, run_cost),
    "audit": Command(_nothing, run_audit),
    "replay": Command(_nothing, run_replay),
}

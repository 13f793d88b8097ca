"""The training-side checkpoint API: protect a training loop in four calls.

    ckpt = CheckpointManager("s3://bucket/ckpt/my-run", model=model, optimizer=optimizer,
                             states={"scheduler": scheduler}, every="500steps")
    step = ckpt.load()                      # 0 on a fresh start, else the step resumed from
    while step < total:
        train_one_step(); step += 1
        if ckpt.due(step):
            ckpt.save(step)
    ckpt.save(step, final=True)             # the end state, once: skipped when `step` is already saved
    ckpt.close()

What shapes training is handed over as named stateful objects (anything with `state_dict`/`load_state_dict`,
DCP's `Stateful`); the model and optimizer are sharded by DCP's `get_state_dict`, the RNG states and the step
are ftrain's. Under `ftrain run` the run, its attempt, location, cadence and dataset revision come from the
supervisor; outside it, from the arguments. Without a process group the manager makes a private one-process
group of its own, so a single-process script is served too.

Every rank writes its own shards with torch.distributed.checkpoint, hashing them as they are written; rank 0
gathers the file digests, seals the step (manifest, then the completion marker) and records `checkpointed`
through the durable outbox, so the log never stalls training. All checkpoint collectives run on a dedicated
gloo group, never on the training group: the async pipeline runs them from a background thread, where a
training-group collective would deadlock. A save fails closed (training goes on); too many failures in a row,
or a newer attempt, stop the job. On a warning signal (SIGUSR1, SIGTERM: `preemption`) every rank saves at the
next step boundary and the process exits with PREEMPTED_EXIT.
"""

import os
import sys
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog
import torch
import torch.distributed as dist
from msgspec import UNSET
from torch import nn
from torch._C._distributed_c10d import HashStore

from ftrain import settings
from ftrain.cadence import parse_checkpoint_every
from ftrain.domain.lifecycle import CheckpointIntent, ReplicaIntent, SnapshotIntent
from ftrain.errors import (
    FtrainError,
    MissingCredentials,
    NoValidCheckpoint,
    ResumeFailed,
    ResumeRefused,
    ResumeStopped,
    SavesFailing,
    StorageUnavailable,
    UnknownRun,
    UnresumableState,
)
from ftrain.events.run_id import InvalidRunId, validate_run_id
from ftrain.events.schema import Checkpointed, DataPosition, SnapshotReplicated, Snapshotted
from ftrain.host.lifeline import die_with_launcher
from ftrain.train.attempt_clock import AttemptClock
from ftrain.train.beacon import ProgressBeacon
from ftrain.train.config import CheckpointConfig
from ftrain.train.faults import fault_point
from ftrain.train.loaders import adopt
from ftrain.train.lost_work import ProgressFile, furthest
from ftrain.train.preemption import PREEMPTED_EXIT, SaveSignals, stop_name
from ftrain.train.process_exit import one_line_errors
from ftrain.train.resume import ResumePoint, resume
from ftrain.train.sampler import accumulation
from ftrain.train.save_check import check_resumable
from ftrain.train.saving import Saver
from ftrain.train.snapshots import MemoryTier
from ftrain.train.state import Resumable, TrainState
from ftrain.workers.integrity import digest_of, to_hex
from ftrain.workers.layout import rank_stage_dir
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.memory_tier import memory_root
from ftrain.workers.recorder import Recorder
from ftrain.workers.stage_dir import UnsafeDirectory, default_stage_dir
from ftrain.workers.staging import StagingBuffers
from ftrain.workers.storage.location import Location, run_location
from ftrain.workers.storage.open import open_run
from ftrain.workers.storage.storage_errors import Fenced, StorageError
from ftrain.workers.unpickle import allow_pickled

__all__ = [
    "PREEMPTED_EXIT",
    "CheckpointConfig",
    "CheckpointManager",
    "Fenced",
    "FtrainError",
    "MissingCredentials",
    "NoValidCheckpoint",
    "ResumeFailed",
    "ResumePoint",
    "ResumeRefused",
    "ResumeStopped",
    "SaveTimes",
    "SavesFailing",
    "StorageUnavailable",
    "TrainState",
    "UnknownRun",
    "UnresumableState",
    "UnsafeDirectory",
    "allow_pickled",
    "make_config",
]
log = structlog.get_logger(__name__)
LOG_WAIT_SECONDS = 60.0
STORE_CHOICE: Final = ("AWS_ENDPOINT_URL", "AWS_CONFIG_FILE", "AWS_PROFILE")
"""The variables that pick which S3 store a bucket is on: two stores can hold the same bucket name."""


class SaveTimes(msgspec.Struct, frozen=True):
    """What a save cost the training loop: sync write, async stage, and waiting for the previous save."""

    save_seconds: float = 0.0
    stage_seconds: float = 0.0
    drain_seconds: float = 0.0


def make_config(
    location: str | Path | None,
    *,
    run_id: str | None = None,
    every: int | str | None = None,
    every_seconds: float | None = None,
    keep: int = 3,
    async_save: bool = False,
    stage_dir: Path | None = None,
    resume: bool = True,
    dataset_revision: str | None = None,
    max_failed_saves: int | None = None,
    world_change: str = "refuse",
    memory_every: int | None = None,
    env: Mapping[str, str] = os.environ,
) -> CheckpointConfig:
    """The configuration from the arguments and, under `ftrain run`, what the supervisor passed (which wins:
    the run, its location, the launch's cadence and dataset revision; a cadence that replaces the script's
    `every` is said on rank 0's stderr), and the digest algorithm saves hash with (FTRAIN_DIGEST). ValueError
    naming the field or the variable."""
    try:
        run_id = settings.run_id(env) or run_id
        written = settings.ckpt_location(env) or location
        launched_every = settings.checkpoint_every(env)
        dataset_revision = settings.dataset_revision(env) or dataset_revision
        failures = max_failed_saves or settings.max_failed_saves(env)
        digest = settings.digest(env)
        launched_memory = settings.memory_every(env)
        memory_dir, memory_cap = settings.memory_dir(env), settings.memory_cap(env)
    except settings.InvalidSetting as exc:
        raise ValueError(str(exc)) from None
    if launched_every is not None:
        if every is not None and _differs(every, launched_every) and env.get("RANK", "0") == "0":
            print(
                f"train: checkpoint cadence {launched_every} (`ftrain run --checkpoint-every`) replaces "
                f"every={every!r} given in the script",
                file=sys.stderr,
                flush=True,
            )
        every = launched_every
    if run_id is not None:
        try:
            validate_run_id(run_id, what="run_id")
        except InvalidRunId as exc:
            raise ValueError(str(exc)) from None
    if written is None:
        raise ValueError("location: required outside `ftrain run` (a directory, or s3://bucket/prefix/<run>)")
    if location is not None and str(location) != str(written):
        log.warning("location_from_supervisor", given=str(location), used=written)
    try:
        place = run_location(written)
    except StorageError as exc:
        raise ValueError(f"location: {exc}") from None
    save_interval = None
    if isinstance(every, int) and not isinstance(every, bool):
        save_interval = every
    elif isinstance(every, str):
        try:
            cadence = parse_checkpoint_every(every)
        except ValueError as exc:
            raise ValueError(f"every: {exc}") from None
        save_interval, every_seconds = cadence.steps, cadence.seconds or every_seconds
    elif every is not None:
        raise ValueError(f"every={every!r}: a step count, or a string like '500steps', '10min'")
    memory_every = _memory_cadence(memory_every if launched_memory is None else launched_memory, run_id)
    job = _job_name(place, run_id, env)
    return CheckpointConfig(
        location=place,
        stage_dir=(stage_dir or default_stage_dir(job)).expanduser().absolute(),
        run_id=run_id,
        save_interval=save_interval,
        every_seconds=every_seconds,
        async_save=async_save,
        keep=keep,
        resume=resume,
        dataset_revision=dataset_revision,
        max_failed_saves=failures,
        world_change=world_change,
        digest=digest,
        memory_every=memory_every,
        memory_root=memory_root(memory_dir, job) if memory_every else None,
        memory_cap=memory_cap,
    )


def _memory_cadence(memory_every: int | None, run_id: str | None) -> int | None:
    """The steps between memory snapshots (None: no memory tier). A job without a run id has none: a
    snapshot is resumed from only when the log vouches for it. ValueError for a bad count."""
    if memory_every is not None and (isinstance(memory_every, bool) or memory_every < 0):
        raise ValueError(f"memory_every={memory_every!r}: a number of steps (0: no memory snapshots)")
    if not memory_every:
        return None
    if run_id is None:
        log.warning(
            "memory_tier_off", reason="no run id: a memory snapshot is resumed only when the log vouches"
        )
        return None
    return memory_every


def _differs(every: int | str, launched: str) -> bool:
    """Whether the script's `every` asks for another cadence than the launch's (unparsable: the error comes
    from the launch's, which is the one used)."""
    try:
        mine = parse_checkpoint_every(f"{every}steps" if isinstance(every, int) else every)
        return mine != parse_checkpoint_every(launched)
    except ValueError:
        return True


def _job_name(place: Location, run_id: str | None, env: Mapping[str, str]) -> str:
    """What names this job's node-local work space: the batch job (it survives a requeue), else the run on its
    store (the run id and a digest of where its checkpoints go): a relaunch finds it again, and a run of the
    same id on another store (a second `ftrain demo`, its own log and bucket) never shares it, nor has its
    staging removed by the other's start-up cleanup."""
    if job := env.get("SLURM_JOB_ID") or env.get("PBS_JOBID"):
        return job
    store = (
        [place.uri, *(env.get(name, "") for name in STORE_CHOICE)] if place.backend == "s3" else [place.uri]
    )
    return f"{run_id or place.run}-{to_hex(digest_of(chr(0).join(store).encode()))[:12]}"


class CheckpointManager:
    """Saves and resumes one training job's state; one instance per rank."""

    def __init__(
        self,
        location: str | Path | None = None,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        states: Mapping[str, Resumable] | None = None,
        loader: object = None,
        every: int | str | None = None,
        keep: int = 3,
        async_save: bool = False,
        stage_dir: Path | None = None,
        resume: bool = True,
        run_id: str | None = None,
        dataset_revision: str | None = None,
        world_change: str = "refuse",
        memory_every: int | None = None,
    ) -> None:
        """`location`: the run's checkpoints, a directory or `s3://bucket/prefix/<run>` (under `ftrain run`:
        the run's). `states`: every other object that shapes training, by name. `loader`: the data loader,
        saved when it can save its position (a loader over `ftrain.train.sampler.GlobalSampler`: a global
        position; torchdata's `StatefulDataLoader`, a loader of your own: per rank), and given a generator of
        its own when it has none (`ftrain.train.loaders`); one that cannot is accepted, and a resume then
        starts its iteration over (a warning says so). `world_change`: a resume on another world size whose
        loader position is per rank (or absent) is refused ("refuse") or goes on with a warning ("warn").
        `every`: steps between saves, or a cadence like `"500steps"`, `"10min"`. `memory_every`: steps
        between memory snapshots (node-local memory, under the durable checkpoints: `ftrain.train.snapshots`;
        FTRAIN_MEMORY_EVERY wins; None or 0: none; only for a run in the log). Raises ValueError naming a
        bad argument before anything is created."""
        named = dict(states or {})
        source = adopt(loader) if loader is not None else None
        if source is not None:
            if "loader" in named:
                raise ValueError("loader: given twice (as loader= and in states)")
            if source.saved is not None:
                named["loader"] = source.saved
            else:
                log.warning(
                    "loader_not_resumable",
                    loader=source.name,
                    consequence="a resume restarts its iteration; exact resume needs a resumable loader "
                    "such as torchdata's StatefulDataLoader, or ftrain.train.sampler.GlobalSampler",
                )
        config = make_config(
            location,
            run_id=run_id,
            every=every,
            keep=keep,
            async_save=async_save,
            stage_dir=stage_dir,
            resume=resume,
            dataset_revision=dataset_revision,
            world_change=world_change,
            memory_every=memory_every,
        )
        state = TrainState(model, optimizer, named, _rank())
        state.data = source
        self._start(config, state)

    @classmethod
    def from_config(cls, config: CheckpointConfig, state: TrainState) -> "CheckpointManager":
        """A manager for a configuration and state built by hand (tests, benchmarks)."""
        manager = cls.__new__(cls)
        manager._start(config, state)
        return manager

    def _start(self, config: CheckpointConfig, state: TrainState) -> None:
        die_with_launcher()
        self._own_group = not dist.is_initialized()
        if self._own_group:  # a single-process script: a private group of one, so every collective is trivial
            dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
        one_line_errors()  # after init_process_group, whose own hook would otherwise wrap it
        self.config = config
        self.state = state
        self.rank = dist.get_rank()
        state.rank = self.rank
        # rank 0 records the lifecycle of a run the log knows; without a run id the location is the truth
        self.recorder = (
            Recorder(config.run_id, settings.nats(os.environ), rank=self.rank)
            if config.run_id and self.rank == 0
            else None
        )
        self.world = dist.get_world_size()
        self.group = dist.new_group(backend="gloo")
        self._signals = SaveSignals(settings.save_signals(os.environ))
        self._beacon = ProgressBeacon.from_env(os.environ, self.rank)
        """This rank's progress, for the supervisor's hang watchdog (off outside `ftrain run`)."""
        agree = self.world > 1 and (config.every_seconds is not None or self._signals.installed)
        self._due_group = dist.new_group(backend="gloo") if agree else None
        self._memory = (
            MemoryTier(config, self._manifest, self._snapshotted if self.recorder is not None else None)
            if config.memory_every is not None
            else None
        )
        """The memory tier under the durable checkpoints (None: off)."""
        memory_groups = [self._memory.group, self._memory.loop_group] if self._memory is not None else []
        self._groups = [g for g in (self.group, self._due_group, *memory_groups) if g is not None]
        """The groups this manager made, destroyed by `close`."""
        self._stopping = False
        self._last_save = time.monotonic()
        self._loop_start = time.monotonic()
        self._stalled = 0.0
        """Seconds the saves held the training loop since it began."""
        self._progress: ProgressFile | None = None
        self._buffers = StagingBuffers()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftrain-ckpt")
        self._inflight: Future[None] | None = None
        self._sealed: int | None = None
        """The newest step this job sealed or resumed from: what a final save of the same step skips."""
        self._completed = False
        """The run's end state is sealed in the durable tier (`save(final=True)`): its memory snapshots go."""
        self._data_at: dict[int, DataPosition] = {}
        """The data position of each step in flight, for its `checkpointed`."""
        self.attempt = 0
        """The run's attempt this job records in (set by `load`; 0: no log to say)."""
        self.resumed: ResumePoint | None = None
        """Where `load` resumed (None: a fresh start)."""
        self.lost: tuple[int, float | None] | None = None
        """The steps (and their seconds) the previous attempt trained past the checkpoint resumed from, as
        this node's rank 0 saw them (None: unknown); reported on every `checkpointed` for goodput."""
        self.store = open_run(config.location, config.stage_dir)
        """The run's checkpoints on their backend: every save and the resume go through it."""
        self._saver = Saver(config, self.group, self._manifest, self._record, self.store)
        self.clock = AttemptClock()
        """What the `checkpointed` events report for goodput."""
        self.snapshot_stall: float | None = None
        """Seconds the memory tier held the loop at the step `due` was last told of (None: no snapshot was
        due there): the trainer's metrics line for it."""
        self._snapshot_trained: dict[int, float] = {}
        """The attempt's training before each snapshot staged and not yet recorded, for its event: the one
        in flight, and the one being staged (a snapshot skipped while another is in flight is dropped)."""

    @property
    def stage_root(self) -> Path:
        """This rank's node-local staging directory."""
        return rank_stage_dir(self.config.stage_dir, self.rank)

    # -- start-up ------------------------------------------------------------------------------------------

    def load(self) -> int:
        """Clean stale staging and partial steps, prove the location writable (rank 0: a probe file written,
        read back, removed), then resume from the newest valid checkpoint; returns the step to continue after
        (0: a fresh start; `resumed` has the step and epoch). Raises, on every rank and before the first step:
        NoValidCheckpoint when checkpoints exist and none is valid (without a log, steps an earlier start set
        aside as corrupt count: `resume=False` is the way to start over on purpose), ResumeRefused when the
        location cannot be written (or its run directory is a link) or the start contradicts the log,
        ResumeStopped when the storage or the log is out of reach, UnsafeDirectory when the stage directory
        is not private."""
        if self._memory is not None:
            self._memory.ready()
        self.resumed, self.attempt, plan = resume(
            self.config, self.state, self.recorder, self.group, self.store, self._memory
        )
        self._saver.vouched(plan.accepted(self.resumed.step if self.resumed else None), plan.retired)
        step = self.resumed.step if self.resumed is not None else 0
        # a step resumed from memory is no durable checkpoint: a final save of it is still due
        self._sealed = self.resumed.step if self.resumed is not None and self.resumed.tier is None else None
        if self.config.async_save and self.resumed is not None:  # so the first save stalls no longer than
            # the next; on a fresh start the optimizer has no state yet, and asking for its state dict would
            # make some (torch steps it once with lr 0: Adam's step count would be off by one)
            self._buffers.reserve(self.state.state_dict())
        if self._progress is not None:  # loaded again (benchmarks)
            self._progress.close()
        self._progress = ProgressFile(
            self.config.stage_dir, self.config.location.uri, self.config.run_name, self.rank
        )
        if self.resumed is not None:
            self.lost = furthest(self._progress.lost(step), self.group)
            if self.lost is not None:
                self.clock.lost(*self.lost)
        self._progress.begin(step)
        self.clock.start()
        self._loop_start, self._stalled = time.monotonic(), 0.0
        return step

    def micro_batches(self, global_batch: int, micro_batch: int) -> int:
        """Micro-batches each rank trains per optimizer step so that this world trains `global_batch`
        samples a step (gradient accumulation: more on a smaller world, fewer on a larger one)."""
        return accumulation(global_batch, micro_batch, self.world)

    @property
    def epoch(self) -> int:
        """The epoch the state was saved in (0 on a fresh start)."""
        return self.resumed.epoch if self.resumed is not None else 0

    # -- saving --------------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Step `step` is done: whether a save is due now, by interval, by wall time as rank 0's clock says,
        or because a warning signal came (every rank makes the same decision, or their collectives would
        diverge: one small all-reduce per step when a clock or a signal must be agreed on)."""
        self._beacon.finished(step)
        self._reached(step)
        if self._progress is not None:
            self._progress.finished(step, self._trained())
        fault_point("step", step)
        by_steps = bool(self.config.save_interval) and step % (self.config.save_interval or 1) == 0
        by_time = (
            self.config.every_seconds is not None
            and self.rank == 0
            and time.monotonic() - self._last_save >= self.config.every_seconds
        )
        signalled = self._signals.received is not None
        if self._due_group is not None:
            flags = torch.tensor([by_time, signalled], dtype=torch.uint8)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._due_group)
            by_time, signalled = bool(flags[0]), bool(flags[1])
        self._stopping = self._stopping or signalled
        due = by_steps or by_time or signalled
        self.snapshot_stall = None
        if not due and self._memory is not None and self._memory.due(step):
            self._snapshot(step)
        return due

    def _snapshot(self, step: int) -> None:
        """A memory snapshot of the state at `step` (a step no durable save takes), staged now and written
        behind; its stall counts as a save's (goodput, the lost work's time)."""
        assert self._memory is not None
        position = self.state.data.position if self.state.data is not None else None
        self.state.step = step
        if position is not None:
            self.state.epoch = position.position().epoch
        skipped, loop_time = self._memory.skipped, self._trained()
        if self.recorder is not None:  # before the take: its thread may record at once
            self._snapshot_trained[step] = self.clock.trained()
        stall = self._memory.take(step, self.state.epoch, self.state.state_dict, self.attempt)
        if self._memory.skipped != skipped:
            self._snapshot_trained.pop(step, None)
        elif self._progress is not None:  # a resume from it times the steps it re-does
            self._progress.snapshotted(step, loop_time)
        self.clock.ended(step, stall)
        self._stalled += stall
        self.snapshot_stall = stall

    def save(self, step: int, epoch: int = 0, *, final: bool = False) -> SaveTimes:
        """Checkpoint the state at `step`: synchronously, or staged and handed to the background pipeline.
        `final=True`, after the loop: the run's end state, sealed before this returns (the async pipeline
        drained), and saved only when `step` is not the step last sealed or resumed from, so the run's last
        checkpoint is its last step, written once. After a warning signal, the save is finished and the
        process exits with PREEMPTED_EXIT. Raises UnresumableState on every rank, before anything is
        written, when the state holds an item a resume could not load (a type outside the unpickler's
        allowlist: `allow_pickled`)."""
        if final:
            drain = self.drain()  # the save in flight may be of this very step
            if self._sealed == step:
                self._completed = True
                return SaveTimes(drain_seconds=drain)
            times = self.save(step, epoch)
            times = msgspec.structs.replace(times, drain_seconds=times.drain_seconds + drain + self.drain())
            self._completed = self._sealed == step
            return times
        self._beacon.saving(step)
        self.state.step, self.state.epoch = step, epoch
        if (position := self._reached(step)) is not None:
            self._data_at[step] = position
        self._last_save = time.monotonic()
        if self._progress is not None:
            self._progress.saved(step, self._trained())
        self.clock.began(step)
        if not self.config.async_save:
            start = time.perf_counter()
            self._seal(step, epoch, self._resumable(step), staged=False)
            times = SaveTimes(save_seconds=time.perf_counter() - start)
            self.clock.ended(step, times.save_seconds)
            self._stalled += times.save_seconds
        else:
            drain = self.drain()
            start = time.perf_counter()
            staged = self._buffers.stage(self._resumable(step))
            stage = time.perf_counter() - start
            fault_point("stage", step)
            self.clock.ended(step, stage + drain)
            self._stalled += stage + drain
            self._inflight = self._worker.submit(self._seal, step, epoch, staged, staged=True)
            times = SaveTimes(stage_seconds=stage, drain_seconds=drain)
        if self._stopping:
            self._exit_preempted(step)
        return times

    def _seal(self, step: int, epoch: int, state: dict[str, Any], *, staged: bool) -> None:
        """Save `state` as `step` (in the caller's thread, or the pipeline's), noting it once sealed."""
        if self._saver.save(step, epoch, state, self.attempt, staged=staged):
            self._sealed = step

    def _reached(self, step: int) -> DataPosition | None:
        """Move the loader's global data position past step `step` (a script may call `save` without `due`);
        returns it (None: the loader keeps none)."""
        position = self.state.data.position if self.state.data is not None else None
        if position is None:
            return None
        position.reached(step)
        return position.position()

    def _resumable(self, step: int) -> dict[str, Any]:
        """The state to save, once every rank found that a resume could load all of it: else every rank
        raises UnresumableState, before anything of the step is written."""
        state = self.state.state_dict()
        check_resumable(state, step, self.group)
        return state

    def _trained(self) -> float:
        """The training loop's time so far, the saves' stalls left out: what lost steps cost to redo."""
        return time.monotonic() - self._loop_start - self._stalled

    def _exit_preempted(self, step: int) -> None:
        """The save asked for by a warning signal is handed over: finish it, deliver the events, exit (every
        rank together: `close` waits for the others)."""
        self.close()
        if self.rank == 0:
            received = self._signals.received
            name = stop_name(received, settings.stop_note()) if received else "a peer's signal"
            print(
                f"PREEMPTED by {name}: checkpoint at step {step} saved, exiting", file=sys.stderr, flush=True
            )
        raise SystemExit(PREEMPTED_EXIT)

    def drain(self) -> float:
        """Wait for the save in flight (re-raising its error); returns the seconds waited."""
        if self._inflight is None:
            return 0.0
        start = time.perf_counter()
        try:
            self._inflight.result()
        finally:
            self._inflight = None
        return time.perf_counter() - start

    def close(self) -> float:
        """Finish the save in flight, stop the pipeline, and wait (up to LOG_WAIT_SECONDS) for the log to take
        what rank 0 recorded; returns the seconds waited for the save. Safe to call more than once.

        The wait is long enough to outlast a NATS leader election: the job's end is the last moment this
        process can deliver its outbox, and on a node whose FTRAIN_HOME no other ftrain process shares (rank 0
        away from the supervisor) what stays there is missing from the log until ftrain next runs on it."""
        try:
            return self.drain()
        finally:
            if self._memory is not None:
                self._memory.close(completed=self._completed)
            self._worker.shutdown(wait=True)
            self._saver.close()
            self._signals.restore()
            self._beacon.close()
            progress, self._progress = self._progress, None
            if progress is not None:
                progress.close()
            recorder, self.recorder = self.recorder, None  # closed once, however often close() is called
            if recorder is not None and not recorder.close(LOG_WAIT_SECONDS):
                log.warning(
                    "events_left_in_outbox",
                    run_id=self.config.run_id,
                    outbox=str(recorder.outbox_file),
                    waited_seconds=LOG_WAIT_SECONDS,
                    delivered_by="the next ftrain process with this FTRAIN_HOME",
                )
            self._release_groups()

    def _release_groups(self) -> None:
        """Destroy the manager's own gloo groups (and a one-process group it made), so a script that goes on
        after `close()` holds none of them. Their threads end only with the last reference, so this does not
        prevent the abort at exit: `process_exit.run_then_exit` does. After a warning signal every rank first
        waits for the others, so that no rank's exit has the launcher end another still delivering its
        events."""
        groups, self._groups = self._groups, []
        if not groups or not dist.is_initialized():
            return
        if self._stopping and self.world > 1:
            dist.barrier(group=self.group)
        for group in groups:
            dist.destroy_process_group(group)
        if self._own_group:
            self._own_group = False
            dist.destroy_process_group()

    def _manifest(self, step: int, epoch: int, entries: list[FileEntry]) -> Manifest:
        return Manifest(
            run_id=self.config.run_name,
            step=step,
            epoch=epoch,
            shards=self.world,
            world_size=self.world,
            dataset_revision=self.config.dataset_revision,
            created_at=datetime.now(UTC),
            files=tuple(sorted(entries, key=lambda e: e.name)),
            extra={"format": "torch.distributed.checkpoint", "torch": str(torch.__version__)},
        )

    def _snapshotted(self, event: Snapshotted | SnapshotReplicated) -> None:
        """Rank 0: a memory snapshot complete on every rank, with the training before it (measured when it
        was staged), then the end of its replica exchange, through the durable outbox."""
        if isinstance(event, Snapshotted):
            trained = self._snapshot_trained.pop(event.step, None)
            never_recorded = [s for s in list(self._snapshot_trained) if s < event.step]  # their save failed
            for older in never_recorded:
                self._snapshot_trained.pop(older, None)
            if trained is not None:
                event = msgspec.structs.replace(event, train_seconds=trained)
        if self.recorder is not None:
            self.recorder.record(
                SnapshotIntent(snapshotted=event)
                if isinstance(event, Snapshotted)
                else ReplicaIntent(snapshot_replicated=event)
            )

    def _record(
        self,
        step: int,
        epoch: int,
        uri: str,
        checkpoint_hash: str,
        manifest: Manifest,
        retired: tuple[int, ...],
    ) -> None:
        """Rank 0: `checkpointed`, naming the steps retention retires, through the durable outbox."""
        data = self._data_at.pop(step, UNSET)
        if self.recorder is not None:
            self.recorder.record(
                CheckpointIntent(
                    checkpointed=self.clock.measured(
                        step,
                        Checkpointed(
                            run_id=self.recorder.run_id,
                            step=step,
                            epoch=epoch,
                            shards=self.world,
                            uri=uri,
                            checkpoint_hash=checkpoint_hash,
                            size_bytes=manifest.size_bytes,
                            attempt=self.attempt,
                            retired=retired or UNSET,
                            data=data,
                        ),
                    )
                )
            )


def _rank() -> int:
    """This process's rank in the job (0 before a process group exists: a single-process script)."""
    return dist.get_rank() if dist.is_initialized() else 0

"""The training-side checkpoint API: `load()` once at start-up, `save(step)` when `due(step)`, `close()` at the end.

Every rank writes its own shards with torch.distributed.checkpoint, hashing them as they are written; rank 0
gathers the file digests, seals the directory (manifest, then the completion marker, then the rename of
`.step-N.tmp` to `step-N`) and records `checkpointed` through the durable outbox, so the log never stalls
training. All checkpoint collectives run on a dedicated gloo group, never on the training group: the async
pipeline runs them from a background thread, where a training-group collective would deadlock.

On object storage (`s3://`) a save, sync or async, is handed to `ObjectSaver` (`ftrain.train.object_save`):
the live state, or the staged copy from the background thread. It fails closed and training goes on; too
many failures in a row, or a newer attempt, stop the job: an async save's error surfaces at the next save,
drain or close.
"""

import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import structlog
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain import settings
from ftrain.events.private import private_dir
from ftrain.events.schema import Checkpointed
from ftrain.projections.lifecycle import CheckpointIntent
from ftrain.train.attempt_clock import AttemptClock
from ftrain.train.config import CheckpointConfig
from ftrain.train.faults import fault_point
from ftrain.train.lifeline import die_with_launcher
from ftrain.train.object_save import ObjectSaver, SavesFailing
from ftrain.train.resume import ResumePoint, cleanup_stale, resume
from ftrain.train.state import TrainState
from ftrain.workers.checkpoint_dir import CheckpointExists, WrittenCheckpoint, seal_checkpoint, set_aside
from ftrain.workers.dcp_writer import HashingWriter
from ftrain.workers.fanout import fan_out
from ftrain.workers.fence import Fenced
from ftrain.workers.fence import check as check_fence
from ftrain.workers.layout import assembly_dir, rank_stage_dir, step_dir
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.recorder import Recorder
from ftrain.workers.retention import prune
from ftrain.workers.stage_dir import safe_stage_dir, same_device
from ftrain.workers.staging import StagingBuffers
from ftrain.workers.unpickle import allow_pickled

__all__ = [
    "CheckpointConfig",
    "CheckpointManager",
    "SaveTimes",
    "SavesFailing",
    "TrainState",
    "allow_pickled",
]
log = structlog.get_logger(__name__)
LOG_WAIT_SECONDS = 60.0


class SaveTimes(msgspec.Struct, frozen=True):
    """What a save cost the training loop: sync write, async stage, and waiting for the previous save."""

    save_seconds: float = 0.0
    stage_seconds: float = 0.0
    drain_seconds: float = 0.0


class CheckpointManager:
    """Saves and resumes one training job's state; one instance per rank."""

    def __init__(self, config: CheckpointConfig, state: TrainState) -> None:
        die_with_launcher()
        self.config = config
        self.state = state
        self.rank = dist.get_rank()
        # rank 0 records the lifecycle of a run the log knows; without a run id the directory is the truth
        self.recorder = (
            Recorder(config.run_id, settings.nats(os.environ), rank=self.rank)
            if config.run_id and self.rank == 0
            else None
        )
        self.world = dist.get_world_size()
        self.group = dist.new_group(backend="gloo")
        self._due_group = dist.new_group(backend="gloo") if config.every_seconds else None
        self._last_save = time.monotonic()
        self._buffers = StagingBuffers()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftrain-ckpt")
        self._pruner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftrain-prune")
        """Deletes checkpoints beyond `keep` behind the training loop, one prune at a time (rank 0)."""
        self._inflight: Future[None] | None = None
        self.write_once = False
        """Async saves write straight into the checkpoint directory (set by `load`: the stage directory is on
        its device, where a staged copy would only write every byte twice)."""
        self.attempt = 0
        """The run's attempt this job records in (set by `load`; 0: no log to say)."""
        self._objects = (
            ObjectSaver(config, self.group, self._manifest, self._record) if config.object_dir else None
        )
        self.clock = AttemptClock()
        """What the `checkpointed` events report for goodput; `clock.lost(n, seconds)` when the script knows
        how many steps the previous attempt trained past the checkpoint this one resumed from (and how long)."""

    @property
    def stage_root(self) -> Path:
        """This rank's node-local staging directory (async saves only)."""
        assert self.config.stage_dir is not None
        return rank_stage_dir(self.config.stage_dir, self.rank)

    # -- start-up ------------------------------------------------------------------------------------------

    def load(self) -> ResumePoint | None:
        """Clean stale staging, then resume from the newest valid checkpoint (None: a fresh start).
        Raises NoValidCheckpoint on every rank when checkpoints exist and none is valid, UnsafeDirectory
        when the staging directory is not private to this user."""
        if self.config.stage_dir is not None and self.config.async_save:
            safe_stage_dir(self.config.stage_dir)
        if self._objects is not None:  # ckpt_dir is this node's work directory, not the storage
            safe_stage_dir(self.config.ckpt_dir)
            cleanup_stale(self.config.ckpt_dir, rank_stage_dir(self.config.ckpt_dir, self.rank), 1)
        else:
            cleanup_stale(
                self.config.ckpt_dir, self.stage_root if self.config.async_save else None, self.rank
            )
        dist.barrier(group=self.group)
        point, self.attempt = resume(self.config, self.state, self.recorder, self.group)
        if self.config.async_save:
            if self._objects is None:
                self.write_once = same_device(self.stage_root.parent, self.config.ckpt_dir)
                log.info("async_saves", write_once=self.write_once, stage_dir=str(self.stage_root.parent))
            if point is not None:  # so the first save stalls no longer than the next; on a fresh start the
                # optimizer has no state yet, and asking for its state dict would make some (torch steps
                # it once with lr 0: Adam's step count would be off by one)
                self._buffers.reserve(self.state.state_dict())
        self.clock.start()
        return point

    # -- saving --------------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether a save is due after `step`: by interval, or by wall time as rank 0's clock says (every rank
        makes the same decision, or their collectives would diverge)."""
        if self.config.save_interval and step % self.config.save_interval == 0:
            return True
        if self._due_group is None or self.config.every_seconds is None:
            return False
        flag = torch.tensor(
            [time.monotonic() - self._last_save >= self.config.every_seconds], dtype=torch.uint8
        )
        dist.broadcast(flag, src=0, group=self._due_group)
        return bool(flag.item())

    def save(self, step: int, epoch: int) -> SaveTimes:
        """Checkpoint the state at `step`: synchronously, or staged and handed to the background pipeline."""
        self.state.step, self.state.epoch = step, epoch
        self._last_save = time.monotonic()
        self.clock.began(step)
        if not self.config.async_save:
            start = time.perf_counter()
            if self._objects is not None:
                self._objects.save(step, epoch, self.state, self.attempt)
            else:
                self._save_sync(step, epoch)
            times = SaveTimes(save_seconds=time.perf_counter() - start)
            self.clock.ended(step, times.save_seconds)
            return times
        drain = self.drain()
        start = time.perf_counter()
        staged = self._buffers.stage(self.state.state_dict())
        stage = time.perf_counter() - start
        fault_point("stage", step)
        self.clock.ended(step, stage + drain)
        if self._objects is not None:
            self._inflight = self._worker.submit(self._objects.save, step, epoch, staged, self.attempt)
        else:
            self._inflight = self._worker.submit(self._save_async, step, epoch, staged)
        return SaveTimes(stage_seconds=stage, drain_seconds=drain)

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
        what rank 0 recorded; returns the seconds waited for the save.

        The wait is long enough to outlast a NATS leader election: the job's end is the last moment this
        process can deliver its outbox, and on a node whose FTRAIN_HOME no other ftrain process shares (rank 0
        away from the supervisor) what stays there is missing from the log until ftrain next runs on it."""
        try:
            return self.drain()
        finally:
            self._worker.shutdown(wait=True)
            self._pruner.shutdown(wait=True)
            recorder, self.recorder = self.recorder, None  # closed once, however often close() is called
            if recorder is not None and not recorder.close(LOG_WAIT_SECONDS):
                log.warning(
                    "events_left_in_outbox",
                    run_id=self.config.run_id,
                    outbox=str(recorder.outbox_file),
                    waited_seconds=LOG_WAIT_SECONDS,
                    delivered_by="the next ftrain process with this FTRAIN_HOME",
                )

    def _save_sync(self, step: int, epoch: int) -> None:
        tmp = self._assembly(step)
        writer = HashingWriter(tmp)
        dcp_save({"app": self.state}, storage_writer=writer, process_group=self.group)
        fault_point("write", step)
        self._finalize(step, epoch, tmp, writer.entries())

    def _save_async(self, step: int, epoch: int, staged: dict[str, Any]) -> None:
        """The background half: rank-local write to the stage dir, fan-out to durable storage, finalize; or,
        when the stage dir shares the destination's device, one write straight into the assembly dir."""
        if self.write_once:
            tmp = self._assembly(step)
            writer = HashingWriter(tmp)
            dcp_save({"app": staged}, storage_writer=writer, process_group=self.group)
            fault_point("write", step)
            fault_point("fanout", step)  # the files are where a fan-out would have put them
            self._finalize(step, epoch, tmp, writer.entries())
            return
        local = step_dir(self.stage_root, step)
        shutil.rmtree(local, ignore_errors=True)
        private_dir(local, tighten=False)
        writer = HashingWriter(local, sync_files=False)
        dcp_save({"app": staged}, storage_writer=writer, process_group=self.group)
        entries = writer.entries()
        fault_point("write", step)
        fan_out(local, self._assembly(step), entries)
        local.rmdir()
        fault_point("fanout", step)
        self._finalize(step, epoch, self._assembly(step), entries)

    def _assembly(self, step: int) -> Path:
        """Where this attempt assembles `step`: never where an older attempt's process may still write."""
        return assembly_dir(self.config.ckpt_dir, step, f"attempt-{self.attempt}" if self.attempt else "")

    def _finalize(self, step: int, epoch: int, tmp: Path, entries: list[FileEntry]) -> None:
        """Gather every rank's file digests on rank 0, which seals the checkpoint and records it."""
        gathered: list[list[FileEntry]] | None = [[] for _ in range(self.world)] if self.rank == 0 else None
        dist.gather_object(entries, gathered, dst=0, group=self.group)
        if gathered is None:
            return
        fault_point("finalize", step)
        manifest = self._manifest(step, epoch, [e for rank_files in gathered for e in rank_files])
        final = step_dir(self.config.ckpt_dir, step)
        written = self._seal(tmp, final, manifest)
        fault_point("sealed", step)
        self._record(step, epoch, written.uri, written.checkpoint_hash, manifest)
        log.info("checkpoint_finalized", step=step, path=str(final), bytes=manifest.size_bytes)
        check_fence(self.config.ckpt_dir, self.attempt)
        self._pruner.submit(self._prune)

    def _prune(self) -> None:
        """Delete the checkpoints beyond `keep`, off the training loop: unlinking a 1 GB checkpoint took
        0.85 s here, which every sync save would otherwise stall for. A newer attempt prunes for itself."""
        try:
            check_fence(self.config.ckpt_dir, self.attempt)
            prune(self.config.ckpt_dir, self.config.keep)
        except Fenced as exc:
            log.warning("prune_skipped", run_dir=str(self.config.ckpt_dir), reason=str(exc))
        except OSError as exc:  # the directory out of reach: the next save's prune tries again
            log.warning("prune_failed", run_dir=str(self.config.ckpt_dir), error=str(exc))

    def _manifest(self, step: int, epoch: int, entries: list[FileEntry]) -> Manifest:
        return Manifest(
            run_id=self.config.run_id
            or (self._objects.run_name if self._objects else self.config.ckpt_dir.name),
            step=step,
            epoch=epoch,
            shards=self.world,
            world_size=self.world,
            dataset_revision=self.config.dataset_revision,
            created_at=datetime.now(UTC),
            files=tuple(sorted(entries, key=lambda e: e.name)),
            extra={"format": "torch.distributed.checkpoint", "torch": str(torch.__version__)},
        )

    def _record(self, step: int, epoch: int, uri: str, checkpoint_hash: str, manifest: Manifest) -> None:
        """Rank 0: `checkpointed`, through the durable outbox."""
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
                        ),
                    )
                )
            )

    def _seal(self, tmp: Path, final: Path, manifest: Manifest) -> WrittenCheckpoint:
        """Seal unless a newer attempt owns the directory (raises Fenced). A `step-N` already there was never
        recorded by this attempt, which is past every step it resumed from: an older attempt's, sealed after
        it was superseded; it is set aside (kept as evidence), never trusted."""
        check_fence(self.config.ckpt_dir, self.attempt)
        try:
            return seal_checkpoint(tmp, final, manifest, self.attempt)
        except CheckpointExists:
            log.warning("older_attempts_checkpoint_set_aside", path=str(final))
            set_aside(final, "unrecorded", f"{int(time.time())}")
            return seal_checkpoint(tmp, final, manifest, self.attempt)

"""Saving a checkpoint to object storage (`s3://`): one sequence for sync and async saves.

Rank 0 claims the step; every rank writes its shards to a private node-local directory (hashing as DCP writes
them) and uploads its own files with those digests; rank 0 gathers every rank's entries and, once every upload
is in and no newer attempt holds the run's fence, seals the step (manifest, then the conditional marker),
records it and prunes. A sync save passes the live state, an async save the staged host copy from the
background thread; either way every collective runs on the checkpoint group, never the training group.

A failure fails the save closed (the step discarded, nothing recorded, one warning line) and training goes on;
after `max_failed_saves` failures in a row every rank raises SavesFailing. A newer attempt fences this one: the
step is discarded and every rank raises Fenced, as on a file system.
"""

import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain.events.private import private_dir
from ftrain.train.config import CheckpointConfig
from ftrain.train.faults import fault_point
from ftrain.train.object_store import run_storage, write_dir
from ftrain.workers.dcp_writer import HashingWriter
from ftrain.workers.fence import Fenced
from ftrain.workers.integrity import Hashed
from ftrain.workers.layout import step_dir
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage import s3_fence
from ftrain.workers.storage.errors import CheckpointExists as StepTaken
from ftrain.workers.storage.errors import StorageError, StorageUnavailable

log = structlog.get_logger(__name__)
SAVE_ERRORS = (StorageError, StorageUnavailable, OSError)
"""What makes a save to object storage fail (closed), not the job: a location refused, the store out of
reach, a step taken, a local file that changed."""

ManifestOf = Callable[[int, int, list[FileEntry]], Manifest]
"""(step, epoch, every rank's files) → the step's manifest."""
Record = Callable[[int, int, str, str, Manifest], None]
"""(step, epoch, URI, checkpoint hash, manifest) → `checkpointed` recorded."""
Reports = list[tuple[list[FileEntry], str | None]]
"""Every rank's files and why its upload failed (None: all in), gathered on rank 0."""


class SavesFailing(RuntimeError):
    """Too many saves in a row failed (object storage out of reach): the job stops on every rank."""


class Outcome(msgspec.Struct, frozen=True):
    """Rank 0's word on a save, broadcast to every rank: the claimed URI, or why the save failed."""

    uri: str | None = None
    failure: str | None = None
    fenced: bool = False


class ObjectSaver:
    """One rank's side of the saves to the run's object storage."""

    def __init__(
        self, config: CheckpointConfig, group: dist.ProcessGroup, manifest: ManifestOf, record: Record
    ) -> None:
        assert config.object_dir is not None
        self.storage, self.run_name = run_storage(config.object_dir)
        self.config = config
        self.group = group
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._manifest, self._record = manifest, record
        self._failed_saves = 0

    def save(self, step: int, epoch: int, app: Any, attempt: int) -> None:
        """Every rank: save `app` (the state, or its staged copy) as `step`. Fails closed; raises SavesFailing
        past the limit of failures in a row, Fenced when a newer attempt owns the run."""
        outcome = _broadcast(self._claim(step) if self.rank == 0 else None, self.group)
        if outcome.uri is not None:
            entries, mine = self._write_and_upload(step, outcome.uri, app)
            gathered: Reports | None = [([], None)] * self.world if self.rank == 0 else None
            dist.gather_object((entries, mine), gathered, dst=0, group=self.group)
            sealed = self._seal(step, epoch, outcome.uri, gathered, attempt) if gathered is not None else None
            outcome = _broadcast(sealed, self.group)
        if outcome.fenced:
            raise Fenced(f"checkpoint at step {step} not saved: {outcome.failure}")
        self._count(step, outcome.failure)

    def _claim(self, step: int) -> Outcome:
        """Rank 0: the claimed step's URI, or why the save cannot start. A sealed step of that name was never
        recorded by this attempt, which is past every step it resumed from: it is set aside, as on a file
        system."""
        try:
            try:
                return Outcome(uri=self.storage.begin(self.run_name, step))
            except StepTaken:
                uri = self.storage.step_uri(self.run_name, step)
                log.warning("older_attempts_checkpoint_set_aside", uri=uri)
                self.storage.quarantine(uri, "unrecorded", f"{int(time.time())}")
                return Outcome(uri=self.storage.begin(self.run_name, step))
        except SAVE_ERRORS as exc:
            return Outcome(failure=str(exc) or type(exc).__name__)

    def _write_and_upload(self, step: int, uri: str, app: Any) -> tuple[list[FileEntry], str | None]:
        """This rank's shards written to its private work directory (hashed as written), then uploaded with
        those digests; the entries, and why the upload failed (None: all in)."""
        local = step_dir(write_dir(self.config.ckpt_dir, self.rank), step)
        shutil.rmtree(local, ignore_errors=True)
        private_dir(local, tighten=False)
        try:
            writer = HashingWriter(local, sync_files=False)
            dcp_save({"app": app}, storage_writer=writer, process_group=self.group)
            entries = writer.entries()
            fault_point("write", step)
            try:
                for entry in entries:
                    self.storage.upload(uri, entry.name, local / entry.name, Hashed(entry.size, entry.digest))
            except SAVE_ERRORS as exc:
                return entries, str(exc) or type(exc).__name__
        finally:
            shutil.rmtree(local, ignore_errors=True)
        fault_point("fanout", step)
        return entries, None

    def _seal(self, step: int, epoch: int, uri: str, gathered: Reports, attempt: int) -> Outcome:
        """Rank 0: seal and record when every rank's upload is in and no newer attempt holds the fence;
        else discard the step. What every rank hears."""
        failure = next((error for _, error in gathered if error), None)
        fenced = False
        if failure is None:
            fault_point("finalize", step)
            manifest = self._manifest(step, epoch, [e for entries, _ in gathered for e in entries])
            try:
                s3_fence.check(self.storage, self.run_name, attempt)
                written = self.storage.seal(uri, manifest)
            except Fenced as exc:
                failure, fenced = str(exc), True
            except SAVE_ERRORS as exc:
                failure = str(exc) or type(exc).__name__
        if failure is not None:
            self.storage.discard(uri)
            return Outcome(failure=failure, fenced=fenced)
        fault_point("sealed", step)
        self._record(step, epoch, written.uri, written.checkpoint_hash, manifest)
        log.info("checkpoint_finalized", step=step, uri=written.uri, bytes=manifest.size_bytes)
        try:
            self.storage.prune(self.run_name, self.config.keep)
        except SAVE_ERRORS as exc:  # the next save prunes again; training goes on
            log.warning("prune_failed", step=step, error=str(exc))
        return Outcome()

    def _count(self, step: int, failure: str | None) -> None:
        """Every rank: reset the count of failed saves, or count this one (and stop past the limit)."""
        if failure is None:
            self._failed_saves = 0
            return
        self._failed_saves += 1
        limit = self.config.max_failed_saves
        if self._failed_saves >= limit:
            raise SavesFailing(
                f"{self._failed_saves} checkpoint saves in a row failed (limit {limit}), the last at step "
                f"{step}: {failure}"
            )
        if self.rank == 0:
            print(
                f"train: warning: checkpoint at step {step} not saved ({self._failed_saves} of {limit} "
                f"failures in a row allowed before stopping): {failure}",
                file=sys.stderr,
                flush=True,
            )


def _broadcast(value: Outcome | None, group: dist.ProcessGroup) -> Outcome:
    """Rank 0's outcome on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    return box[0]

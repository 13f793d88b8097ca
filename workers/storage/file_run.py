"""One run's checkpoints on a file system, as the trainer's ranks write and resume them (`port.RunStore`).

The ranks assemble a step in one hidden directory of the run (`.step-N.tmp[-attempt-A]`, never where an older
attempt's process may still write), each writing its files straight into it (sync saves, and async saves whose
stage directory shares the run's device), or into a private directory on node-local disk and then fanned out
(`workers.fanout`); rank 0 seals it by the rename to `step-N` (`workers.checkpoint_dir`). A resume verifies each
rank's owned files in place: the step directory is what DCP reads.
"""

import os
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import structlog

from ftrain.domain.lifecycle import OnDisk
from ftrain.events.private import private_dir
from ftrain.workers import checkpoint_dir as fs
from ftrain.workers import fence, retention
from ftrain.workers.fanout import fan_out
from ftrain.workers.layout import (
    SetAsideKind,
    assemblies,
    assembly_dir,
    assembly_writer,
    rank_stage_dir,
    set_asides,
    step_dir,
)
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.nofollow import remove_dir
from ftrain.workers.stage_dir import safe_stage_dir, same_device
from ftrain.workers.storage.errors import StorageUnavailable
from ftrain.workers.storage.file_store import FileStorage
from ftrain.workers.storage.location import Location
from ftrain.workers.storage.port import RankFiles, Readable, StoredCheckpoint
from ftrain.workers.storage.probe import probe_dir

log = structlog.get_logger(__name__)


class FileRunStore:
    """A run's directory, and this node's stage directory for async saves."""

    def __init__(self, location: Location, stage_dir: Path) -> None:
        self._location = location
        self.run = location.path
        self.storage = FileStorage(self.run.parent)
        self.stage_dir = stage_dir
        self.write_once = False
        """Staged saves write straight into the assembly (set by `prepare`: the stage directory is on the
        run's device, where a staged copy would only write every byte twice)."""

    @property
    def location(self) -> Location:
        return self._location

    # -- start-up and resume -------------------------------------------------------------------------------

    def prepare(self, rank: int, *, staged: bool) -> None:
        if not staged:
            return
        safe_stage_dir(self.stage_dir)
        remove_leftovers(rank_stage_dir(self.stage_dir, rank))
        self.write_once = same_device(self.stage_dir, self.run)
        log.info("async_saves", write_once=self.write_once, stage_dir=str(self.stage_dir))

    def reachable(self) -> None:
        fs.require_listable(self.run)

    def probe(self) -> None:
        probe_dir(self.run, self._location.uri)

    def complete(self) -> list[OnDisk]:
        return self.storage.complete(self._location.run)

    def quarantined(self) -> list[str]:
        return [fs.path_uri(aside.path) for aside in set_asides(self.run) if aside.kind == "corrupt"]

    def owner(self) -> int:
        return fence.owner(self.run)

    def claim(self, attempt: int) -> None:
        fence.claim(self.run, attempt)

    def check(self, attempt: int) -> None:
        fence.check(self.run, attempt)

    def clean(self) -> list[str]:
        """The trainer's interrupted assemblies (named by step and attempt: no save of the run is running at
        start-up), and those of writers on this host that died mid-write."""
        removed = [
            fs.path_uri(path)
            for path in assemblies(self.run)
            if assembly_writer(path) is None and remove_leftovers(path)
        ]
        return removed + self.storage.clean(self._location.run)

    def confined(self, uri: str) -> str | None:
        return self.storage.confined(uri, self._location.run)

    def read_manifest(self, uri: str, expected_hash: str | None, *, run_id: str, step: int) -> Manifest | str:
        return fs.read_manifest(fs.uri_path(uri), expected_hash, run_id=run_id, step=step)

    @contextmanager
    def readable(
        self, uri: str, manifest: Manifest, files: Sequence[FileEntry], *, start: str, rank: int
    ) -> Iterator[Readable]:
        """The files verified in place: the step directory is what DCP reads."""
        path = fs.uri_path(uri)
        try:
            verdict: str | StorageUnavailable | None = fs.verify_files(path, files)
        except StorageUnavailable as exc:
            verdict = exc
        yield Readable(path, verdict)

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        return self.storage.quarantine(uri, kind, tag)

    # -- saving --------------------------------------------------------------------------------------------

    def begin(self, step: int, attempt: int) -> str:
        tmp = assembly_dir(self.run, step, f"attempt-{attempt}" if attempt else "")
        private_dir(self.run, tighten=False)
        remove_dir(self.run, tmp.name, unlink_link=True)  # a failed save of this step by this attempt
        private_dir(tmp, tighten=False)
        return fs.path_uri(tmp)

    @contextmanager
    def rank_files(self, uri: str, step: int, rank: int, *, staged: bool) -> Iterator[RankFiles]:
        if not staged or self.write_once:
            yield RankFiles(fs.uri_path(uri), final=True)
            return
        with local_files(step_dir(rank_stage_dir(self.stage_dir, rank), step)) as files:
            yield files

    def deliver(self, uri: str, written: RankFiles, entries: Sequence[FileEntry]) -> None:
        if not written.final:
            fan_out(written.path, fs.uri_path(uri), entries)

    def seal(self, uri: str, manifest: Manifest, attempt: int) -> StoredCheckpoint:
        """Seal unless a newer attempt owns the run (Fenced). A `step-N` already there was never recorded by
        this attempt, which is past every step it resumed from: an older attempt's, sealed after it was
        superseded; it is set aside (kept as evidence), never trusted."""
        self.check(attempt)
        tmp, final = fs.uri_path(uri), step_dir(self.run, manifest.step)
        if os.path.lexists(final):  # set aside first: the rename must find the name free
            log.warning("older_attempts_checkpoint_set_aside", path=str(final))
            fs.set_aside(final, "unrecorded", f"{int(time.time())}")
        written = fs.seal_checkpoint(tmp, final, manifest, attempt)
        return StoredCheckpoint(written.uri, written.manifest, written.checkpoint_hash)

    def discard(self, uri: str) -> None:
        remove_leftovers(fs.uri_path(uri))

    def prune(self, steps: Collection[int], attempt: int) -> list[int]:
        self.check(attempt)
        return retention.prune(self.run, steps)


def remove_leftovers(path: Path) -> bool:
    """Remove a directory of ours (a link there is removed, never followed: the next save would write
    through it); whether something was removed. What cannot be removed is logged: the next start retries."""
    try:
        removed = remove_dir(path.parent, path.name, unlink_link=True)
    except OSError as exc:
        log.warning("stale_staging_not_removed", path=str(path), error=str(exc))
        return False
    if removed:
        log.info("stale_staging_removed", path=str(path))
    return removed


@contextmanager
def local_files(path: Path) -> Iterator[RankFiles]:
    """A fresh private node-local directory for one rank's files of one step, removed on exit."""
    remove_leftovers(path)
    private_dir(path, tighten=False)
    try:
        yield RankFiles(path, final=False)
    finally:
        remove_leftovers(path)

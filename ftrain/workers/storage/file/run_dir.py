"""The file-system backend of the storage port (local disk, NFS, Lustre, GPFS): one run's directory, in the
three roles of `workers.storage.port`.

The ranks assemble a step in one hidden directory of the run (`.step-N.tmp[-attempt-A]`, never where an older
attempt's process may still write), each writing its files straight into it (sync saves, and async saves whose
stage directory shares the run's device), or into a private directory on node-local disk and then fanned out
(`fanout`); rank 0 seals it by the rename to `step-N` (`checkpoint_dir`). A writer outside the attempts (the
CLI) assembles in a directory named for its process. A resume verifies each rank's owned files in place: the
step directory is what DCP reads.
"""

import os
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ftrain.domain.lifecycle import OnDisk
from ftrain.host.nofollow import remove_dir
from ftrain.host.private_files import private_dir
from ftrain.workers.integrity import ALGORITHM
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
from ftrain.workers.stage_dir import local_files, remove_leftovers, safe_stage_dir, same_device
from ftrain.workers.storage.file import checkpoint_dir as fs
from ftrain.workers.storage.file import fence_file, retention
from ftrain.workers.storage.file.fanout import fan_out
from ftrain.workers.storage.file.page_cache import cached
from ftrain.workers.storage.file.probe_dir import probe_dir
from ftrain.workers.storage.location import Location, path_uri, uri_path
from ftrain.workers.storage.port import RankFiles, Readable, StoredCheckpoint
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.storage.verdict import verify_files

if TYPE_CHECKING:
    from ftrain.workers.dcp_writer import HashingWriter

log = structlog.get_logger(__name__)


class FileRun:
    """A run's directory, and this node's stage directory for async saves (None: a process that saves and
    resumes nothing of its own, as the CLI)."""

    def __init__(self, location: Location, stage_dir: Path | None = None) -> None:
        self._location = location
        self.run = location.path
        self.stage_dir = stage_dir
        self.write_once = False
        """Staged saves write straight into the assembly (set by `prepare`: the stage directory is on the
        run's device, where a staged copy would only write every byte twice)."""

    @property
    def location(self) -> Location:
        return self._location

    @property
    def _stage(self) -> Path:
        assert self.stage_dir is not None, "a store opened without a stage directory saves nothing staged"
        return self.stage_dir

    # -- guard ---------------------------------------------------------------------------------------------

    def prepare(self, rank: int, *, staged: bool) -> None:
        safe_stage_dir(self._stage)
        if not staged:
            return
        remove_leftovers(rank_stage_dir(self._stage, rank))
        self.write_once = same_device(self._stage, self.run)
        log.info("async_saves", write_once=self.write_once, stage_dir=str(self._stage))

    def reachable(self) -> None:
        fs.require_listable(self.run)

    def probe(self) -> None:
        probe_dir(self.run, self._location.uri)

    def owner(self) -> int:
        return fence_file.owner(self.run)

    def claim(self, attempt: int) -> None:
        fence_file.claim(self.run, attempt)

    def check(self, attempt: int) -> None:
        fence_file.check(self.run, attempt)

    def clean(self) -> list[str]:
        """The trainer's interrupted assemblies (named by step and attempt: no save of the run is running at
        start-up), and those of writers on this host that died mid-write."""
        removed = [
            path_uri(path)
            for path in assemblies(self.run)
            if assembly_writer(path) is None and remove_leftovers(path)
        ]
        return removed + [path_uri(p) for p in fs.remove_dead_assemblies(self.run)]

    def prune(self, steps: Collection[int], attempt: int) -> list[int]:
        self.check(attempt)
        return retention.prune(self.run, steps)

    # -- reader --------------------------------------------------------------------------------------------

    def complete(self) -> list[OnDisk]:
        return fs.on_disk(self.run)

    def quarantined(self) -> list[str]:
        return [path_uri(aside.path) for aside in set_asides(self.run) if aside.kind == "corrupt"]

    def confined(self, uri: str) -> str | None:
        path = fs.confined(uri, self.run)
        return path_uri(path) if path else None

    def read_manifest(
        self, uri: str, expected_hash: str | None, *, run_id: str | None = None, step: int | None = None
    ) -> Manifest | str:
        return fs.read_manifest(uri_path(uri), expected_hash, run_id=run_id, step=step)

    @contextmanager
    def readable(
        self, uri: str, manifest: Manifest, files: Sequence[FileEntry], *, start: str, rank: int
    ) -> Iterator[Readable]:
        """The files verified in place, those with chunk digests as the load reads them unless every chunk
        is in the page cache already (`cached`): the step directory is what DCP reads."""
        path = uri_path(uri)
        left = [f for f in files if f.chunked and not cached(path, f)]
        try:
            verdict: str | StorageUnavailable | None = verify_files(path, [f for f in files if f not in left])
        except StorageUnavailable as exc:
            verdict = exc
        yield Readable(path, verdict, chunked=True, left=frozenset(f.name for f in left))

    def verify(
        self, uri: str, expected_hash: str, *, run_id: str | None = None, step: int | None = None
    ) -> str | None:
        return fs.verify_checkpoint(uri_path(uri), expected_hash, run_id=run_id, step=step)

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        moved = fs.set_aside(uri_path(uri), kind, tag)
        return path_uri(moved) if moved else None

    # -- writer --------------------------------------------------------------------------------------------

    def begin(self, step: int, attempt: int | None) -> str:
        if attempt is None:
            return path_uri(fs.begin_assembly(self.run, step))
        tmp = assembly_dir(self.run, step, f"attempt-{attempt}" if attempt else "")
        private_dir(self.run, tighten=False)
        remove_dir(self.run, tmp.name, unlink_link=True)  # a failed save of this step by this attempt
        private_dir(tmp, tighten=False)
        return path_uri(tmp)

    @contextmanager
    def rank_files(self, uri: str, step: int, rank: int, *, staged: bool) -> Iterator[RankFiles]:
        if not staged or self.write_once:
            yield RankFiles(uri_path(uri), final=True)
            return
        with local_files(step_dir(rank_stage_dir(self._stage, rank), step)) as files:
            yield files

    def dcp_writer(self, uri: str, target: RankFiles, algorithm: str) -> "HashingWriter":
        from ftrain.workers.dcp_writer import HashingWriter  # torch: only where a rank saves

        assert target.path is not None, "a file system's rank files are a directory"
        return HashingWriter(target.path, sync_files=target.final, algorithm=algorithm)

    def deliver(self, uri: str, written: RankFiles, entries: Sequence[FileEntry]) -> None:
        if not written.final:
            assert written.path is not None, "staged files are a local directory"
            fan_out(written.path, uri_path(uri), entries)

    def put(self, uri: str, name: str, source: bytes | Path, algorithm: str = ALGORITHM) -> FileEntry:
        return fs.write_source(uri_path(uri), name, source, algorithm)

    def seal(self, uri: str, manifest: Manifest, attempt: int | None) -> StoredCheckpoint:
        """Seal unless a newer attempt owns the run (Fenced). A `step-N` already there was never recorded by
        this attempt, which is past every step it resumed from: an older attempt's, sealed after it was
        superseded; it is set aside (kept as evidence), never trusted. Outside the attempts, the step taken
        meanwhile refuses the seal (CheckpointExists) and this writer's assembly goes."""
        tmp, final = uri_path(uri), step_dir(self.run, manifest.step)
        if attempt is None:
            try:
                return fs.seal_checkpoint(tmp, final, manifest)
            except BaseException:
                remove_leftovers(tmp)
                raise
        self.check(attempt)
        if os.path.lexists(final):  # set aside first: the rename must find the name free
            log.warning("older_attempts_checkpoint_set_aside", path=str(final))
            fs.set_aside(final, "unrecorded", f"{int(time.time())}")
        return fs.seal_checkpoint(tmp, final, manifest, attempt)

    def discard(self, uri: str) -> None:
        remove_leftovers(uri_path(uri))

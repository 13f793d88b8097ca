"""The S3 backend of the storage port: one run's key prefix, in the three roles of `workers.storage.port`. What
happens in the bucket is functions over a `Bucket` and the run's key: a step's objects (`step_objects`), the
fence (`fence_object`), partial work (`partial`).

Saving: rank 0 claims the step (`step_objects.begin`); each rank streams its shards into the step from memory
as DCP writes them, hashing them on the way (`dcp_stream`), or, where that measured slower, writes them to a
private directory of this node's stage directory (hashing as DCP writes them) and uploads its own files with
those digests (`STREAM_SYNC`, `STREAM_ASYNC`); rank 0 seals the step (manifest, then the conditional marker)
once every rank's files are in and no newer attempt holds the fence. A writer outside the attempts (the CLI)
uploads its files straight from where they are.

Resuming: a candidate's data files with chunk digests (format 3) are not downloaded: the load reads each chunk
straight from the store, one ranged GET a chunk, and DCP parses a chunk's items once it matched
(`chunk_reads`, `workers.verified_chunks`); each rank checks every chunk of the files it owns. The rest
(`.metadata`, files of formats 1 and 2) is downloaded into one cache per node, shared by the node's ranks: each
rank fetches only the files it owns, in parallel ranged reads hashed as they arrive, so every byte crosses the
network and is hashed once in the job. The cache is made by whichever rank of the node gets there first (`claim_dir`), which
also removes it once the load is over; it is named for the start and the step, so a crashed start's leftovers
are never taken for this one's. A file the load needs that the node lacks (its owner is on another node) is
fetched whole into the rank's scratch directory and verified there before it is renamed into the cache.
"""

import os
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final

import structlog

from ftrain.domain.lifecycle import OnDisk
from ftrain.workers.dcp_reader import METADATA, Rejected
from ftrain.workers.dcp_writer import HashingWriter
from ftrain.workers.integrity import ALGORITHM, Hashed
from ftrain.workers.layout import SetAsideKind, parse_set_aside, rank_stage_dir, run_key, step_dir
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.stage_dir import claim_dir, local_files, remove_leftovers, safe_stage_dir
from ftrain.workers.storage.location import Location
from ftrain.workers.storage.port import RankFiles, Readable, StoredCheckpoint
from ftrain.workers.storage.probe import probe_body, unreadable, unwritable
from ftrain.workers.storage.s3 import fence_object, partial, step_objects
from ftrain.workers.storage.s3.boto_client import error_code, reason, shared_client
from ftrain.workers.storage.s3.bucket import Bucket, ObjectMissing
from ftrain.workers.storage.s3.chunk_reads import RangedChunks
from ftrain.workers.storage.s3.dcp_stream import streamed_writer
from ftrain.workers.storage.storage_errors import CheckpointExists, StorageUnavailable

log = structlog.get_logger(__name__)
_CACHE = "download-"
WRONG_CODES: Final = frozenset(
    {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"}
)
"""What an S3 store answers a start-up probe for a bucket that is not this job's to write (read-only or wrong
credentials): it will answer the same next time. A bucket that does not answer (NoSuchBucket included) stays
out of reach, as for every read."""
STREAM_SYNC: Final = True
STREAM_ASYNC: Final = False
"""Whether each kind of save streams its files to the store from memory (else: written to local files,
then uploaded), as measured side by side by `scripts/bench_s3.py` (docs/benchmarks.md, the S3 section)."""


class S3Run:
    """A run's prefix in a bucket, and this node's work directory for uploads and downloads (None: a process
    that saves and resumes nothing of its own, as the CLI)."""

    def __init__(self, location: Location, stage_dir: Path | None = None, client: Any = None) -> None:
        bucket, prefix = location.bucket_prefix
        self._location = location
        self.bucket = Bucket(bucket, client or shared_client())
        self.run = location.run
        self.key = run_key(prefix, self.run)
        """The run's key prefix (ending in '/'): every object of the run is under it."""
        self.stage_dir = stage_dir
        self.stream_sync = STREAM_SYNC
        """Sync saves stream each rank's files from memory (else: local files, then uploaded)."""
        self.stream_async = STREAM_ASYNC
        """Async saves (of the staged copy, in the background) stream them from memory."""

    @property
    def location(self) -> Location:
        return self._location

    @property
    def _stage(self) -> Path:
        assert self.stage_dir is not None, "a store opened without a stage directory uploads nothing staged"
        return self.stage_dir

    # -- guard ---------------------------------------------------------------------------------------------

    def prepare(self, rank: int, *, staged: bool) -> None:
        """Every save and resume works in the stage directory, staged or not."""
        safe_stage_dir(self._stage)
        remove_leftovers(rank_stage_dir(self._stage, rank))

    def reachable(self) -> None:
        self.bucket.reach(self.key)

    def probe(self) -> None:
        """Put, get back and delete a probe object directly under the run's key prefix (beside `.attempt`: a
        listing of the run's steps never sees it). A bucket that refuses these credentials a write is a
        StorageError; anything else out of reach stays StorageUnavailable."""
        body, name = probe_body()
        key = self.key + name
        try:
            self.bucket.put(key, body)
            try:
                read = self.bucket.get(key)
            finally:
                self.bucket.delete([key])
        except ObjectMissing:
            read = b""
        except StorageUnavailable as exc:
            if exc.__cause__ is not None and error_code(exc.__cause__) in WRONG_CODES:
                raise unwritable(self._location.uri, reason(exc.__cause__)) from None
            raise
        if read != body:
            raise unreadable(self._location.uri)

    def owner(self) -> int:
        return fence_object.owner(self.bucket, self.key)

    def claim(self, attempt: int) -> None:
        fence_object.claim(self.bucket, self.key, attempt)

    def check(self, attempt: int) -> None:
        fence_object.check(self.bucket, self.key, attempt)

    def clean(self) -> list[str]:
        return partial.clean(self.bucket, self.key)

    def prune(self, steps: Collection[int], attempt: int) -> list[int]:
        self.check(attempt)
        return step_objects.prune(self.bucket, self.key, steps)

    # -- reader --------------------------------------------------------------------------------------------

    def complete(self) -> list[OnDisk]:
        return step_objects.complete(self.bucket, self.key)

    def quarantined(self) -> list[str]:
        return [
            self.bucket.uri(self.key + name)
            for name in self.bucket.children(self.key)
            if (aside := parse_set_aside(name)) is not None and aside[1] == "corrupt"
        ]

    def confined(self, uri: str) -> str | None:
        return step_objects.confined(self.bucket, uri, self.key)

    def read_manifest(
        self, uri: str, expected_hash: str | None, *, run_id: str | None = None, step: int | None = None
    ) -> Manifest | str:
        return step_objects.read_manifest(self.bucket, uri, expected_hash, run_id=run_id, step=step)

    @contextmanager
    def readable(
        self, uri: str, manifest: Manifest, files: Sequence[FileEntry], *, start: str, rank: int
    ) -> Iterator[Readable]:
        """The files with chunk digests left for the load to read chunk by chunk from the store, the others
        downloaded into the node's cache, hashed as they arrive."""
        left = frozenset(f.name for f in files if f.chunked and f.name != METADATA)
        name = f"{_CACHE}{start}-step-{manifest.step}"
        cache, scratch = self._stage / name, rank_stage_dir(self._stage, rank) / "fetch"
        created = False
        try:
            try:
                created = claim_dir(self._stage, name)
                if created:  # a start that did not finish left these
                    for stale in os.listdir(self._stage):
                        if stale.startswith(_CACHE) and stale != name:
                            remove_leftovers(self._stage / stale)
                whole = [f for f in files if f.name not in left]
                verdict: str | StorageUnavailable | None = step_objects.fetch(self.bucket, uri, whole, cache)
            except StorageUnavailable as exc:
                verdict = exc
            except OSError as exc:  # the local cache, not the checkpoint
                verdict = StorageUnavailable(f"local cache {cache}: {exc}")
            log.info(
                "resume_downloaded",
                rank=rank,
                uri=uri,
                files=[e.name for e in files if e.name not in left],
                verdict=str(verdict or ""),
            )
            yield Readable(
                cache,
                verdict,
                FetchForLoad(self.bucket, uri, manifest.files, cache, scratch, rank),
                chunked=True,
                left=left,
                source=RangedChunks(
                    self.bucket.client, self.bucket.name, step_objects.step_key(self.bucket, uri)
                ),
            )
        finally:
            remove_leftovers(scratch)
            with suppress(OSError):  # the rank's directory goes too, unless something else is in it
                scratch.parent.rmdir()
            if created:
                remove_leftovers(cache)

    def verify(
        self, uri: str, expected_hash: str, *, run_id: str | None = None, step: int | None = None
    ) -> str | None:
        return step_objects.verify(self.bucket, uri, expected_hash, run_id=run_id, step=step)

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        return step_objects.quarantine(self.bucket, uri, kind, tag)

    # -- writer --------------------------------------------------------------------------------------------

    def begin(self, step: int, attempt: int | None) -> str:
        """Claim the step. For an attempt, a sealed step of that name was never recorded by it, which is past
        every step it resumed from: it is set aside, as on a file system."""
        if attempt is None:
            return step_objects.begin(self.bucket, self.key, step)
        try:
            return step_objects.begin(self.bucket, self.key, step)
        except CheckpointExists:
            uri = step_objects.step_uri(self.bucket, self.key, step)
            log.warning("older_attempts_checkpoint_set_aside", uri=uri)
            step_objects.quarantine(self.bucket, uri, "unrecorded", f"{int(time.time())}")
            return step_objects.begin(self.bucket, self.key, step)

    @contextmanager
    def rank_files(self, uri: str, step: int, rank: int, *, staged: bool) -> Iterator[RankFiles]:
        """Streamed into the step from memory, or written to a private local directory and uploaded after,
        whichever measured faster for the kind of save (`stream_sync`, `stream_async`)."""
        if self.stream_async if staged else self.stream_sync:
            yield RankFiles(None, final=True)
            return
        with local_files(step_dir(rank_stage_dir(self._stage, rank) / "upload", step)) as files:
            yield files

    def dcp_writer(self, uri: str, target: RankFiles, algorithm: str) -> HashingWriter:
        if target.path is None:
            return streamed_writer(self.bucket, step_objects.step_key(self.bucket, uri), algorithm)
        return HashingWriter(target.path, sync_files=False, algorithm=algorithm)

    def deliver(self, uri: str, written: RankFiles, entries: Sequence[FileEntry]) -> None:
        if written.path is None:
            return
        for entry in entries:
            known = Hashed(entry.size, entry.digest)
            step_objects.upload(self.bucket, uri, entry.name, written.path / entry.name, known)

    def put(self, uri: str, name: str, source: bytes | Path, algorithm: str = ALGORITHM) -> FileEntry:
        return step_objects.upload(self.bucket, uri, name, source, algorithm=algorithm)

    def seal(self, uri: str, manifest: Manifest, attempt: int | None) -> StoredCheckpoint:
        if attempt is not None:
            self.check(attempt)
        return step_objects.seal(self.bucket, uri, manifest)

    def discard(self, uri: str) -> None:
        step_objects.discard(self.bucket, uri)


class FetchForLoad:
    """The load's fetch hook: a file this rank's plan reads that its node's cache lacks (its owner is on
    another node) is downloaded whole into this rank's scratch directory, verified there, and only then
    renamed into the cache, so the ranks of a node never see each other's partial bytes. A defect raises
    Rejected, storage out of reach StorageUnavailable: DCP hands either to every rank."""

    def __init__(
        self,
        bucket: Bucket,
        uri: str,
        files: tuple[FileEntry, ...],
        cache: Path,
        scratch: Path,
        rank: int,
    ) -> None:
        self.bucket, self.uri, self.cache, self.scratch, self.rank = bucket, uri, cache, scratch, rank
        self.entries = {entry.name: entry for entry in files}

    def __call__(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            raise Rejected(f"DCP metadata names file {name!r}, which the manifest does not list")
        try:
            if os.path.lexists(self.cache / name):  # downloaded and verified by a rank of this node
                return
            safe_stage_dir(self.scratch)
            if verdict := step_objects.fetch(self.bucket, self.uri, [entry], self.scratch):
                raise Rejected(verdict)
            os.rename(self.scratch / name, self.cache / name)
        except OSError as exc:
            raise StorageUnavailable(f"local cache {self.cache}: {exc}") from exc
        log.info("fetched_for_load", rank=self.rank, uri=self.uri, file=name, size=entry.size)

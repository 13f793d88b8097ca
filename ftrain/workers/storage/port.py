"""The storage port: one run's checkpoints, whatever holds them, cut by role as DCP cuts its storage layer.

A run's checkpoints live at `<root>/<run>/step-<N>` (`Location`). Every backend gives the same guarantees: a
step is absent or complete (data files, then the manifest, then the completion marker, sealed last and never
overwritten); a checkpoint URI is trusted only when it names a step directly under the run's own location
(`confined`); verification reads each byte once, hashing it, and never parses a byte before its hash matched;
"storage unavailable" (`StorageUnavailable`) is never reported as corruption. A backend is one class that
plays the three roles below; `workers.storage.open` picks it by scheme, and nothing else knows the backends.

Every method raises StorageUnavailable when the storage is out of reach, StorageError for a location it cannot
use. The trainer's ranks and the CLI (one rank: `workers.storage.one_rank`) call the same methods; rank 0's
part of a trainer's start-up is the three functions at the end, each one call order below.
"""

import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec
import structlog

from ftrain.domain.lifecycle import Candidate, OnDisk, ResumePlan
from ftrain.workers.integrity import ALGORITHM
from ftrain.workers.layout import SetAsideKind
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage.location import Location
from ftrain.workers.storage.storage_errors import OUTSIDE_RUN, StorageError, StorageUnavailable

if TYPE_CHECKING:
    from ftrain.workers.dcp_writer import HashingWriter  # torch: only where a rank saves
    from ftrain.workers.verified_chunks import ChunkSource

log = structlog.get_logger(__name__)


class StoredCheckpoint(msgspec.Struct, frozen=True):
    """A sealed checkpoint: its URI and the hash that identifies its manifest in the log."""

    uri: str
    manifest: Manifest
    checkpoint_hash: str


Source = tuple[str, bytes | Path]
"""A data file of a checkpoint: its name, and its bytes or a local file to upload or copy."""


class RankFiles(msgspec.Struct, frozen=True):
    """Where one rank writes its files of a step being saved: `final` when that is the step itself (each
    file made durable as it is written: the step's assembly directory, or, `path` None, the step's objects,
    each streamed from memory as it is written), else a private node-local directory they are moved from
    (`StepWriter.deliver`)."""

    path: Path | None
    final: bool


@dataclass(frozen=True)
class Readable:
    """A rank's owned files of a candidate, local and judged: the directory DCP reads from, this rank's
    verdict on its files (None: clean), and the hook that fetches a file the load needs that `path` lacks.
    `chunked`: the load checks chunk by chunk the files with chunk digests it reads and this rank did not
    check (`workers.dcp_reader.unchecked`); `left`: those of its files it left for the load so (the verdict is
    on the others); `source`: where the load reads their chunks (None: the files in `path`)."""

    path: Path
    verdict: str | StorageUnavailable | None
    fetch: Callable[[str], None] | None = None
    chunked: bool = False
    left: frozenset[str] = frozenset()
    source: "ChunkSource | None" = None


class StepWriter(Protocol):
    """Writes one step of the run. Call order:

    1. (rank 0) `begin`: the step's URI, sent to every rank;
    2. (every rank) `rank_files`, written into through `dcp_writer`, then `deliver`ed to the URI; a writer of
       one process with its files at hand (the CLI) `put`s each instead;
    3. (rank 0, once every rank delivered) `seal`, or on any failure `discard`.

    `attempt` None is a writer outside the run's attempts (the CLI): a step already there refuses it
    (CheckpointExists) and nothing is fenced; an attempt's writer sets an older attempt's step aside instead.
    """

    def begin(self, step: int, attempt: int | None) -> str:
        """Start saving `step`; the URI every rank delivers to. CheckpointExists (attempt None) when the step
        is sealed or another writer claimed it; for an attempt, an older attempt's sealed step of that name
        (never recorded by this one) is set aside, here or at `seal`."""
        ...

    def rank_files(
        self, uri: str, step: int, rank: int, *, staged: bool
    ) -> AbstractContextManager[RankFiles]:
        """Where this rank writes its files of the step begun at `uri` (`staged`: from a staged copy, in the
        background); a private local directory is removed on exit."""
        ...

    def dcp_writer(self, uri: str, target: RankFiles, algorithm: str) -> "HashingWriter":
        """The DCP storage writer of this rank's files into `target` (of the step begun at `uri`), each file
        hashed by `algorithm` as it is written: its `entries()` after `dcp.save`."""
        ...

    def deliver(self, uri: str, written: RankFiles, entries: Sequence[FileEntry]) -> None:
        """Move this rank's written files (their digests known from the write) into the step at `uri`
        (nothing to move when they were written there: `written.final`)."""
        ...

    def put(self, uri: str, name: str, source: bytes | Path, algorithm: str = ALGORITHM) -> FileEntry:
        """Write one data file straight into the step at `uri`, hashed (by `algorithm`) as it goes (one
        read); StorageError for a name a checkpoint's data file may not take."""
        ...

    def seal(self, uri: str, manifest: Manifest, attempt: int | None) -> StoredCheckpoint:
        """Manifest, then marker: the step is complete. Fenced when a newer attempt holds the run (nothing
        sealed); CheckpointExists when another writer sealed the step first."""
        ...

    def discard(self, uri: str) -> None:
        """Remove what a failed save left at `uri`, or a sealed step this process could not record (best
        effort: `RunGuard.clean` finishes the rest)."""
        ...


class StepReader(Protocol):
    """Reads the run's steps for a resume. Call order:

    1. (rank 0) `complete` (and, without a log, `quarantined`): the candidates;
    2. (rank 0) per candidate, `confined` then `read_manifest`, sent to every rank;
    3. (every rank) `readable`: its owned files local and judged, for DCP; a reader of one process that only
       judges (the CLI) calls `verify` instead of 2-3;
    4. (rank 0) `quarantine` a candidate that failed.
    """

    def complete(self) -> list[OnDisk]:
        """The run's sealed steps, newest first, each with the hash its marker claims (unverified)."""
        ...

    def quarantined(self) -> list[str]:
        """The URIs of the run's steps set aside as corrupt (kept as evidence)."""
        ...

    def confined(self, uri: str) -> str | None:
        """`uri` when it names a step location directly under the run's own, else None (refused unread)."""
        ...

    def read_manifest(
        self, uri: str, expected_hash: str | None, *, run_id: str | None = None, step: int | None = None
    ) -> Manifest | str:
        """The manifest of the (confined) step at `uri` when its marker and digest check out (against
        `expected_hash`, or the marker's own when None: the log is out of reach) and it names `run_id` and
        `step` (when given), else why not. No data file is read."""
        ...

    def readable(
        self, uri: str, manifest: Manifest, files: Sequence[FileEntry], *, start: str, rank: int
    ) -> AbstractContextManager[Readable]:
        """This rank's `files` of the step at `uri` readable locally and judged (each byte read once, hashed);
        `start` names this start's downloads. What it made local is removed on exit."""
        ...

    def verify(
        self, uri: str, expected_hash: str, *, run_id: str | None = None, step: int | None = None
    ) -> str | None:
        """None when the (confined) step at `uri` is valid for the log's hash, every file hashed where it
        lies and nothing kept; else why not."""
        ...

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        """Move the step out of its name, kept as evidence; its new URI, None if it was gone."""
        ...


class RunGuard(Protocol):
    """Keeps the run's location fit to write to. Call order:

    1. (every rank, at start-up) `prepare`;
    2. (rank 0, before the first step) `reachable` where checkpoints are expected, `check`, `clean`, `probe`,
       then `claim` (`owner` says the last claim when the log cannot);
    3. (rank 0, after a step is sealed and recorded) `prune`.
    """

    @property
    def location(self) -> Location:
        """The run's location."""
        ...

    def prepare(self, rank: int, *, staged: bool) -> None:
        """Every rank at start-up: its node-local work space made private (the trainer keeps its progress
        record there) and, where saves stage (and on object storage, where every save and resume works there),
        emptied of what an interrupted save or resume of this rank left there. UnsafeDirectory when it is not
        private."""
        ...

    def reachable(self) -> None:
        """Raise StorageUnavailable unless the run's location can be listed (never creates it)."""
        ...

    def probe(self) -> None:
        """Write a small private file (object) in the run's location, read it back and remove it (a missing
        run directory is created). StorageError when the location is wrong (cannot be written or read back,
        the run's directory a link, a write refused to these credentials)."""
        ...

    def owner(self) -> int:
        """The attempt that last claimed the run (0: none has)."""
        ...

    def claim(self, attempt: int) -> None:
        """Claim the run for `attempt` (never lowers a claim); Fenced when a newer attempt holds it."""
        ...

    def check(self, attempt: int) -> None:
        """Raise Fenced when a newer attempt than `attempt` has claimed the run."""
        ...

    def clean(self) -> list[str]:
        """Remove the run's stale partial steps (no live writer owns them); what went."""
        ...

    def prune(self, steps: Collection[int], attempt: int) -> list[int]:
        """Delete the sealed steps of `steps` (retention's decision: `workers.layout.retire`); those found
        and deleted. Fenced when a newer attempt holds the run: it prunes for itself."""
        ...


class RunStorage(StepWriter, StepReader, RunGuard, Protocol):
    """One backend's run: the three roles, as `workers.storage.open.open_run` returns them."""


class Header(msgspec.Struct, frozen=True):
    """Rank 0's reading of a candidate, for every rank: its URI once confined to the run's own, and its
    manifest, or why it is refused (`uri` None: refused unread), or the storage out of reach."""

    uri: str | None
    manifest: Manifest | str | StorageUnavailable


def ready(guard: RunGuard, attempt: int, *, expected: bool) -> None:
    """Rank 0, before the first step (`RunGuard` step 2): the stale partial work removed before anything is
    written (on a full disk, the dead attempt's partial step is what frees the space), the location proven
    writable, the run claimed for `attempt` (0: a job without a run id claims nothing). A superseded start
    stops at the fence, before it removes anything of the newer attempt's. `expected`: checkpoints are
    expected there, so the probe must not recreate a missing root."""
    if expected:
        guard.reachable()
    if attempt:
        guard.check(attempt)
    guard.clean()
    guard.probe()
    if attempt:
        guard.claim(attempt)


def set_aside_planned(reader: StepReader, plan: ResumePlan) -> None:
    """Move what the plan sets aside out of the way (kept as evidence, never deleted): steps the log never
    recorded, and with --no-resume the older checkpoints, so the fresh run owns the step names."""
    stamp = str(int(time.time()))
    for unrecorded in plan.unrecorded:
        log.warning("unrecorded_checkpoint_set_aside", uri=unrecorded.uri)
        reader.quarantine(unrecorded.uri, "unrecorded", stamp)
    for old in plan.superseded:
        reader.quarantine(old.uri, "superseded", stamp)


def read_header(reader: StepReader, candidate: Candidate, run_id: str) -> Header:
    """Rank 0's reading of the candidate's marker and manifest (`StepReader` step 2), once its URI is found
    to name a step of the run's own (else nothing is read); storage out of reach is returned, not raised."""
    try:
        uri = reader.confined(candidate.uri)
        if uri is None:
            return Header(None, OUTSIDE_RUN)
        return Header(uri, reader.read_manifest(uri, candidate.digest, run_id=run_id, step=candidate.step))
    except StorageUnavailable as exc:
        return Header(None, exc)
    except StorageError as exc:
        return Header(None, str(exc))

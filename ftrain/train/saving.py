"""Saving a checkpoint: one sequence for sync saves (the live state) and async saves (the staged copy, from the
background thread), on every backend (`workers.storage.port.RunStorage`).

Rank 0 begins the step (a file system: the attempt's assembly directory; S3: the claim); every rank writes its
shards where and through the writer the store says (hashing as DCP writes them) and delivers them (already in
place — written there, or streamed to S3 from memory —, fanned out from node-local disk, or uploaded with
their digests); rank 0 gathers every rank's entries and, once all are in and
no newer attempt holds the run's fence, seals the step, decides what retention retires (`workers.layout.retire`,
by the steps the log accepted, never by a listing alone), records the step naming them, and hands their
deletion to a pruner thread (off the training loop: unlinking a 1 GB checkpoint took 0.85 s here). Every
collective runs on the checkpoint group, never the training group. "Accepted" counts what rank 0 handed to
the outbox: the log refuses only an older attempt's records, and an older attempt is fenced before it prunes.

A failure of any kind on the way (begin, write, deliver, seal, record) fails the save closed (the step
discarded, nothing recorded, one warning line naming the exception's type) and training goes on; after
`max_failed_saves` failures in a row every rank raises SavesFailing. Not only I/O errors: torch reports a full
disk as a RuntimeError from its writer, and no exception type tells a full disk from a bug. A bug fails every
save the same way, so it still stops the job, `max_failed_saves` saves later, naming its type; meanwhile the
run's checkpoints are untouched, and training loses nothing it would not lose by stopping at once.

A newer attempt fences this one: the step is discarded and every rank raises Fenced; a rank 0 that learns it
only after recording (it was stopped in between) raises alone, without waiting on peers that may be dead or
stopped.
"""

import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import msgspec
import structlog
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain.errors import SavesFailing as SavesFailing
from ftrain.events.schema import RETIRED_MAX
from ftrain.train.config import CheckpointConfig
from ftrain.train.faults import fault_point
from ftrain.workers.layout import retire
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.storage.port import RunStorage
from ftrain.workers.storage.storage_errors import Fenced

log = structlog.get_logger(__name__)
REASON_CHARS = 400

ManifestOf = Callable[[int, int, list[FileEntry]], Manifest]
"""(step, epoch, every rank's files) → the step's manifest."""
Record = Callable[[int, int, str, str, Manifest, tuple[int, ...]], None]
"""(step, epoch, URI, checkpoint hash, manifest, steps retention retires) → `checkpointed` handed to the
outbox."""
Reports = list[tuple[list[FileEntry], str | None]]
"""Every rank's files and why its write failed (None: all in), gathered on rank 0."""


class Outcome(msgspec.Struct, frozen=True):
    """Rank 0's word on a save, broadcast to every rank: the begun step's URI, or why the save failed."""

    uri: str | None = None
    failure: str | None = None
    fenced: bool = False
    sealed: bool = False
    """Fenced only after the step was sealed and recorded (a process stopped in between): the log refused it.
    Rank 0 alone learns it, and stops without a word to peers that may be gone."""


class Saver:
    """One rank's side of the run's saves."""

    def __init__(
        self,
        config: CheckpointConfig,
        group: dist.ProcessGroup,
        manifest: ManifestOf,
        record: Record,
        store: RunStorage,
    ) -> None:
        self.config, self.group, self.store = config, group, store
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._manifest, self._record = manifest, record
        self._failed_saves = 0
        self._pruner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftrain-prune")
        """Deletes checkpoints beyond `keep` behind the training loop, one prune at a time (rank 0)."""
        self._accepted: set[int] | None = None if config.run_id is None else set()
        """Rank 0: the steps the log accepted that retention has not retired: vouched for at start-up, or
        handed to the outbox by this job since. None: no log (no run id), and the listing decides."""
        self._retired: set[int] = set()
        """Rank 0: the steps retention retired (this job's records, or the log's before it), handed to every
        prune: one a deletion missed (it failed, or a stop came first) is deleted by the next."""

    def vouched(self, accepted: Iterable[int], retired: Iterable[int]) -> None:
        """Rank 0, at start-up: the steps the log vouches for and those its records retired. Ignored without
        a log. One the log vouches for that is gone from storage (pruned by an ftrain from before `retired`)
        is retired by the first save's record, so the log learns it is gone."""
        if self._accepted is not None:
            self._accepted, self._retired = set(accepted), set(retired)

    def save(self, step: int, epoch: int, app: Any, attempt: int, *, staged: bool) -> bool:
        """Every rank: save `app` (the live state, or its staged copy) as `step`; whether it was sealed. Fails
        closed; raises SavesFailing past the limit of failures in a row, Fenced when a newer attempt owns the
        run."""
        outcome = _broadcast(self._begin(step, attempt) if self.rank == 0 else None, self.group)
        if outcome.uri is not None:
            report = self._write(step, outcome.uri, app, staged)
            gathered: Reports | None = [([], None)] * self.world if self.rank == 0 else None
            dist.gather_object(report, gathered, dst=0, group=self.group)
            sealed = self._seal(step, epoch, outcome.uri, gathered, attempt) if gathered is not None else None
            if (
                sealed is not None and sealed.sealed
            ):  # rank 0 woke from a stop: its peers may be dead or stopped
                _raise_fenced(step, sealed)  # so it does not wait on them; the launcher ends the rest
            outcome = _broadcast(sealed, self.group)
        if outcome.fenced:
            _raise_fenced(step, outcome)
        self._count(step, outcome.failure)
        return outcome.failure is None

    def close(self) -> None:
        """Wait for the prune in flight."""
        self._pruner.shutdown(wait=True)

    def _begin(self, step: int, attempt: int) -> Outcome:
        """Rank 0: the begun step's URI, or why the save cannot start."""
        try:
            return Outcome(uri=self.store.begin(step, attempt))
        except Exception as exc:
            return Outcome(failure=_reason(exc))

    def _write(self, step: int, uri: str, app: Any, staged: bool) -> tuple[list[FileEntry], str | None]:
        """This rank's shards written where the store says (hashed as written), then delivered into the step;
        the entries, and why the write failed (None: all in). A failure inside DCP's write reaches every rank
        (its collectives end on each), one in the delivery only this rank: either way every rank reaches the
        gather."""
        with self.store.rank_files(uri, step, self.rank, staged=staged) as target:
            writer = self.store.dcp_writer(uri, target, self.config.digest)
            try:
                dcp_save({"app": app}, storage_writer=writer, process_group=self.group)
            except CheckpointException as exc:
                return [], _reason(next(failure for failure, _ in exc.failures.values()))
            entries = writer.entries()
            fault_point("write", step)
            try:
                self.store.deliver(uri, target, entries)
            except Exception as exc:
                return entries, _reason(exc)
        fault_point("fanout", step)
        return entries, None

    def _seal(self, step: int, epoch: int, uri: str, gathered: Reports, attempt: int) -> Outcome:
        """Rank 0: seal and record (naming what retention retires) when every rank's files are in and no newer
        attempt holds the fence; else discard the step. What every rank hears."""
        failure = next((error for _, error in gathered if error), None)
        fenced = False
        if failure is None:
            fault_point("finalize", step)
            manifest = self._manifest(step, epoch, [e for entries, _ in gathered for e in entries])
            try:
                written = self.store.seal(uri, manifest, attempt)
            except Fenced as exc:
                failure, fenced = str(exc), True
            except Exception as exc:
                failure = _reason(exc)
        if failure is not None:
            self.store.discard(uri)
            return Outcome(failure=failure, fenced=fenced)
        fault_point("sealed", step)
        retired = self._retire(step)
        try:
            self._record(step, epoch, written.uri, written.checkpoint_hash, manifest, retired)
        except Exception as exc:  # the outbox refused it (its disk full): the step stays, unrecorded
            self._unretire(step, retired)
            return Outcome(failure=f"not recorded: {_reason(exc)}")
        log.info(
            "checkpoint_finalized", step=step, uri=written.uri, bytes=manifest.size_bytes, retired=retired
        )
        try:  # a process stopped between sealing and recording wakes up here: a newer attempt may own the run
            self.store.check(attempt)
        except Fenced as exc:  # the step stays where it is: the newer attempt set it aside, or will
            return Outcome(failure=str(exc), fenced=True, sealed=True)
        except Exception as exc:  # out of reach: the prune checks again
            log.warning("fence_unchecked", step=step, error=_reason(exc))
        if self._accepted is None or self._retired:
            self._pruner.submit(
                self._prune, None if self._accepted is None else sorted(self._retired), attempt
            )
        return Outcome()

    def _retire(self, step: int) -> tuple[int, ...]:
        """Rank 0, `step` just sealed: the steps its record names as retired, those beyond the newest `keep`
        the log accepted (`workers.layout.retire`; decided from memory: no storage request delays the save);
        none without a log (the pruner decides from the listing)."""
        self._retired.discard(step)  # sealed anew: never deleted for an earlier step of its name
        if self._accepted is None:
            return ()
        self._accepted.add(step)
        beyond = retire(sorted(self._accepted, reverse=True), self.config.keep, self._accepted)
        retired = tuple(beyond[-RETIRED_MAX:])  # the oldest first: one event names a bounded number
        self._accepted.difference_update(retired)
        self._retired.update(retired)
        return retired

    def _unretire(self, step: int, retired: tuple[int, ...]) -> None:
        """Rank 0: the record of `step` failed: the log accepted neither it nor its retirements."""
        if self._accepted is not None:
            self._accepted.discard(step)
            self._accepted.update(retired)
        self._retired.difference_update(retired)

    def _prune(self, steps: list[int] | None, attempt: int) -> None:
        """Delete the retired `steps` still on storage (None, without a log: those the listing puts beyond
        `keep`); never the one just sealed: retention keeps at least two. A newer attempt prunes for itself,
        and what cannot be deleted now is tried again by the next save's prune."""
        try:
            if steps is None:
                steps = retire([found.step for found in self.store.complete()], self.config.keep, None)
            self.store.prune(steps, attempt)
        except Fenced as exc:
            log.warning("prune_skipped", location=self.store.location.uri, reason=str(exc))
        except Exception as exc:
            log.warning("prune_failed", location=self.store.location.uri, error=_reason(exc))

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


def _raise_fenced(step: int, outcome: Outcome) -> NoReturn:
    done = "sealed, but the log refused it" if outcome.sealed else "not saved"
    raise Fenced(f"checkpoint at step {step} {done}: {outcome.failure}")


def _reason(exc: BaseException) -> str:
    """One line, at most REASON_CHARS: the exception's type (a bug is told from a full disk by it) and its
    message (torch's spans lines and carries a C++ trace)."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def _broadcast(value: Outcome | None, group: dist.ProcessGroup) -> Outcome:
    """Rank 0's outcome on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    assert box[0] is not None
    return box[0]

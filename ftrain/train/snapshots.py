"""Memory snapshots: every `memory_every` steps the whole job's state goes to node-local memory, verified and
recorded, so an unwarned kill of the job's processes loses at most `memory_every` steps instead of everything
since the last durable checkpoint.

The training loop's only stall is the copy into host buffers (the async save's staging, with buffers of the
tier's own). One background thread per rank then writes this rank's state with DCP alone (no collective:
each rank's snapshot holds all that rank resumes from, on its own node), hashing each file as it is written,
into its private directory (`workers.memory_tier`). On a gloo group of the tier's own (never the training
group, never the durable pipeline's) every rank's admission is agreed, its files gathered by rank 0, which
builds the manifest (every rank's files under `rank-<r>/`) and sends it to every rank to seal its part; once
every part is sealed rank 0 records `snapshotted` through the outbox, and once every rank has heard it did,
each rank drops its older snapshots (never before: until then the log names the older one). Every
collective runs in the same order on every rank, in that one thread; a failure of any kind skips the
snapshot, logged, and training goes on.

On a job of several nodes, once a snapshot is recorded, each rank on that same thread sends its part to its
buddy (`memory_tier.buddy`: the same local rank on the next node) while receiving its source's, which it
verifies against the manifest and seals as `replica-<source>` (a mismatch: dropped, logged); once the
exchange ends rank 0 records `snapshot_replicated` (per node: its ranks' replicas landed, dropped, failed)
through the outbox, as it does `snapshotted`, which names each node's part (`snapshot_parts`).

Training never waits on that thread: a snapshot starts only once every rank's previous one is done, and
when one is still going at the next snapshot step (a slow peer, a slow write) every rank skips that step,
rank 0 logging `memory_snapshot_skipped` with the count so far. The ranks agree on it from the loop, on a
gloo group of the loop's own (the thread owns the tier's group; the training group may be NCCL), so their
threads stay in lock-step: no rank snapshots a step another skipped. A slow peer makes snapshots sparser
and the replica late, never the loop slower.
"""

import os
import socket
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, TypeVar

import structlog
import torch.distributed as dist
from msgspec import UNSET, UnsetType
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ftrain.events.schema import SnapshotReplicated, Snapshotted
from ftrain.train.agreement import any_rank, rank_zeros
from ftrain.train.config import CheckpointConfig
from ftrain.train.faults import fault_point
from ftrain.train.replication import swap
from ftrain.workers.dcp_writer import HashingWriter
from ftrain.workers.integrity import digest_of, to_hex
from ftrain.workers.manifest import FileEntry, Manifest, encode_manifest
from ftrain.workers.memory_tier import (
    UnsafeDirectory,
    admit,
    begin_rank,
    buddy,
    concatenated,
    held_bytes,
    keep_replica,
    local_entries,
    named,
    node_parts,
    prune,
    rank_dir,
    ready_root,
    remove_rank,
    room,
    seal_rank,
    snapshot_dir,
)
from ftrain.workers.snapshot_parts import Outcome, part_replicas, snapshot_parts
from ftrain.workers.staging import StagingBuffers, local_bytes

log = structlog.get_logger(__name__)
T = TypeVar("T")
NO_DIST: Final = "torch.distributed is disabled, unavailable or uninitialized"
"""The start of the warning DCP gives at every save and load with `no_dist`: each rank's part is its own on
purpose, so it is not repeated at every snapshot."""
warnings.filterwarnings("ignore", message=NO_DIST, category=UserWarning)
ManifestOf = Callable[[int, int, list[FileEntry]], Manifest]
Record = Callable[[Snapshotted | SnapshotReplicated], None]
"""Rank 0: hand `snapshotted` (then `snapshot_replicated`) to the outbox."""


class MemoryTier:
    """One rank's memory snapshots of the job (`CheckpointConfig.memory_every` set)."""

    def __init__(self, config: CheckpointConfig, manifest: ManifestOf, record: Record | None) -> None:
        assert config.memory_every is not None and config.memory_root is not None
        self.every, self.root, self.cap, self.digest = (
            config.memory_every,
            config.memory_root,
            config.memory_cap,
            config.digest,
        )
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        self.buddy = buddy(self.rank, self.local_world, self.world)
        """The rank on the next node that holds this rank's replica (None: one node, no replication)."""
        self.source = None if self.buddy is None else (self.rank - self.local_world) % self.world
        """The rank whose replica this one holds."""
        self.strays = (
            node_parts(self.rank, self.local_world, self.world) if self.rank % self.local_world == 0 else None
        )
        """On the node's first rank, the parts its ranks hold: any other an earlier world left, it drops."""
        self.group = dist.new_group(backend="gloo")
        """The tier's thread's group: every collective of a snapshot."""
        self.loop_group = dist.new_group(backend="gloo")
        """The training loop's group: whether every rank's snapshot in flight is done (`take`)."""
        self._manifest, self._record = manifest, record
        self._buffers = StagingBuffers()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftrain-memory")
        self._inflight: Future[None] | None = None
        self.newest: int | None = None
        """The step of this job's newest recorded snapshot (None: none yet)."""
        self.skipped = 0
        """The snapshot steps skipped so far because a rank's previous snapshot was still in flight."""
        self.hosts: list[str] = []
        """Every rank's host name, in rank order (learned by `ready`): the nodes the log names."""

    def ready(self) -> None:
        """Every rank, at start-up: its node's snapshot directory readied (private, 0700); a directory refused
        on any rank raises UnsafeDirectory on every rank (the lowest refusing rank's words); every rank's
        host name learned."""
        try:
            ready_root(self.root)
            refusal = None
        except UnsafeDirectory as exc:
            refusal = str(exc)
        every = self._all((refusal, socket.gethostname()))
        self.hosts = [host for _, host in every]
        refused = next((r for r, _ in every if r is not None), None)
        if refused is not None:
            raise UnsafeDirectory(refused)

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def take(self, step: int, epoch: int, state: Callable[[], dict[str, Any]], attempt: int) -> float:
        """Stage the state at `step` (`state` gives its state dict) and hand it to the background thread,
        unless a rank's previous snapshot is still in flight (then every rank skips `step`); the seconds the
        loop was held (agreeing, the state dict, the copy)."""
        start = time.perf_counter()
        if self._in_flight(step):
            return time.perf_counter() - start
        self.wait()  # done on every rank: its outcome collected, never waited for
        staged = self._buffers.stage(state())
        self._inflight = self._worker.submit(self._snapshot, step, epoch, staged, attempt)
        return time.perf_counter() - start

    def _in_flight(self, step: int) -> bool:
        """Whether any rank's previous snapshot is still in flight, agreed by every rank; if so, the
        snapshot of `step` is skipped (counted, rank 0 logs it)."""
        if not any_rank(self._inflight is not None and not self._inflight.done(), self.loop_group):
            return False
        self.skipped += 1
        if self.rank == 0:
            log.warning(
                "memory_snapshot_skipped",
                step=step,
                reason="the previous snapshot is still in flight (a slow peer or write)",
                skipped=self.skipped,
            )
        return True

    def wait(self) -> None:
        """Wait for the snapshot in flight (its failures are logged, never raised)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def close(self, *, completed: bool) -> None:
        """Finish the snapshot in flight and stop the thread; `completed` (the run's end state is sealed in
        the durable tier): remove this rank's snapshots from its node."""
        self.wait()
        self._worker.shutdown(wait=True)
        if completed and remove_rank(self.root, self.rank, self.source, self.strays):
            log.info("memory_snapshots_removed", path=str(self.root))

    def _snapshot(self, step: int, epoch: int, staged: dict[str, Any], attempt: int) -> None:
        """Every rank, on the tier's thread: admit, write, seal, record, prune (see the module's docstring)."""
        try:
            self._snapshot_of(step, epoch, staged, attempt)
        except Exception as exc:  # a peer gone mid-collective, a full tmpfs: skip it, never stop training
            log.warning(
                "memory_snapshot_failed", step=step, rank=self.rank, error=f"{type(exc).__name__}: {exc}"
            )

    def _snapshot_of(self, step: int, epoch: int, staged: dict[str, Any], attempt: int) -> None:
        refusal = self._admission(staged)
        refused = next(((r, why) for r, why in enumerate(self._all(refusal)) if why is not None), None)
        if refused is not None:
            if self.rank == 0:
                log.warning("memory_snapshot_skipped", step=step, rank=refused[0], reason=refused[1])
            return
        written = self._write(step, staged)
        every: list[list[FileEntry] | str] | None = [[]] * self.world if self.rank == 0 else None
        dist.gather_object(written, every, dst=0, group=self.group)
        combined = self._combined(step, epoch, every) if every is not None else None
        manifest = rank_zeros(combined, self.group)
        recorded, failure = self._sealed_and_recorded(manifest, attempt)
        if failure is not None:
            if self.rank == 0:
                log.warning("memory_snapshot_failed", step=step, reason=failure)
            prune(
                self.root, self.rank, self.newest, self.source, self.strays
            )  # drops this one; the newest recorded stays
            return
        assert isinstance(manifest, Manifest)
        self.newest = step
        prune(self.root, self.rank, step, self.source, self.strays)
        if self.buddy is not None:
            held = self._all(self._replicate(manifest, attempt))
            if self.rank == 0:
                log.info("memory_replicated", step=step, replicas=held.count("landed"), of=self.world)
                self._replicated(recorded, held)
        if self.rank == 0:  # once recorded: a kill here finds the snapshot in the log
            fault_point("snapshot", step)

    def _admission(self, staged: dict[str, Any]) -> str | None:
        """Why this rank may not write a snapshot of `staged` now (None: it may). Replicating, it will hold its
        source's part beside its own: as large, ranks of a node holding alike."""
        need = local_bytes(staged) * (1 if self.buddy is None else 2)
        try:
            free, total = room(self.root)
            return admit(need, held_bytes(self.root, self.rank, self.source), self.cap, free, total)
        except OSError as exc:
            return f"memory snapshot directory unreadable: {exc}"

    def _write(self, step: int, staged: dict[str, Any]) -> list[FileEntry] | str:
        """This rank's state written alone into its part of the snapshot, hashed as written: its files as the
        manifest names them, or why the write failed."""
        try:
            path = begin_rank(self.root, step, self.rank)
            writer = HashingWriter(path, sync_files=False, algorithm=self.digest)
            dcp_save({"app": staged}, storage_writer=writer, no_dist=True)
            return named(self.rank, writer.entries())
        except Exception as exc:
            return f"rank {self.rank}: {type(exc).__name__}: {exc}"

    def _combined(self, step: int, epoch: int, every: list[list[FileEntry] | str]) -> Manifest | str:
        """Rank 0: the snapshot's manifest over every rank's files, or the first rank's failure."""
        if failure := next((w for w in every if isinstance(w, str)), None):
            return failure
        return self._manifest(
            step, epoch, [e for files in every if not isinstance(files, str) for e in files]
        )

    def _sealed_and_recorded(self, manifest: object, attempt: int) -> tuple[Snapshotted | None, str | None]:
        """Every rank's part of `manifest` (rank 0's manifest, or why it has none) sealed, then rank 0's
        `snapshotted` recorded: the event (rank 0's), or the first failure, the same on every rank. Only then
        may a rank drop the snapshot the log names: a kill between one rank's drop and rank 0's record left
        the log naming a snapshot that rank no longer held, and the resume fell back to durable storage."""
        failure = self._seal(manifest, attempt) if isinstance(manifest, Manifest) else str(manifest)
        if (first := next((f for f in self._all(failure) if f is not None), None)) is not None:
            return None, first
        assert isinstance(manifest, Manifest)
        recorded, unrecorded = self._recorded(manifest, attempt)
        return recorded, self._all(unrecorded)[0]

    def _recorded(self, manifest: Manifest, attempt: int) -> tuple[Snapshotted | None, str | None]:
        """Rank 0: `snapshotted` of `manifest`'s snapshot to the outbox, naming each node's part; the event
        (None: nothing to record, or not rank 0), or why it could not be recorded."""
        if self._record is None:
            return None, None
        fault_point("snapshot_sealed", manifest.step)
        event = Snapshotted(
            run_id=manifest.run_id,
            step=manifest.step,
            epoch=manifest.epoch,
            shards=self.world,
            uri=snapshot_dir(self.root, manifest.step).as_uri(),
            checkpoint_hash=to_hex(digest_of(encode_manifest(manifest))),
            size_bytes=manifest.size_bytes,
            attempt=attempt,
            parts=snapshot_parts(manifest, self.hosts, self.local_world) if self.hosts else UNSET,
        )
        try:
            self._record(event)
        except Exception as exc:  # the outbox unwritable: the log cannot name this snapshot
            return None, f"not recorded: {type(exc).__name__}: {exc}"
        return event, None

    def _replicated(self, recorded: Snapshotted | None, held: list[Outcome]) -> None:
        """Rank 0, the exchange over: `snapshot_replicated` of the snapshot it `recorded` to the outbox, when
        that named its parts (`held`: what each rank made of the replica it holds)."""
        if self._record is None or recorded is None or isinstance(recorded.parts, UnsetType):
            return
        self._record(
            SnapshotReplicated(
                run_id=recorded.run_id,
                snapshot_seq=0,  # decided against the log: the `snapshotted` event of this digest
                step=recorded.step,
                checkpoint_hash=recorded.checkpoint_hash,
                replicas=part_replicas(held, self.local_world),
                attempt=recorded.attempt,
            )
        )

    def _replicate(self, manifest: Manifest, attempt: int) -> Outcome:
        """Send this rank's part of `manifest`'s snapshot to its buddy while receiving its source's, which is
        kept, verified against the manifest and sealed, or dropped (logged); what became of it. A failure
        is logged, never raised: the snapshot stands without its replica."""
        assert self.buddy is not None and self.source is not None
        step, theirs = manifest.step, local_entries(manifest, self.source)
        fault_point("replicate", step)
        try:
            mine = concatenated(rank_dir(self.root, step, self.rank), local_entries(manifest, self.rank))
            sent = swap(self.group, self.buddy, mine, self.source, sum(e.size for e in theirs))
            dropped = keep_replica(self.root, step, self.source, manifest, sent, attempt)
        except Exception as exc:  # a peer gone, a full tmpfs: the replica is missing, the snapshot stands
            log.warning(
                "memory_replica_failed", step=step, source=self.source, error=f"{type(exc).__name__}: {exc}"
            )
            return "failed"
        if dropped is not None:
            log.warning("memory_replica_dropped", step=step, source=self.source, reason=dropped)
            return "dropped"
        return "landed"

    def _seal(self, manifest: Manifest, attempt: int) -> str | None:
        """This rank's part sealed (the manifest's copy, then the marker), or why not."""
        try:
            seal_rank(rank_dir(self.root, manifest.step, self.rank), manifest, attempt)
        except OSError as exc:
            return f"rank {self.rank}: {type(exc).__name__}: {exc}"
        return None

    def _all(self, value: T) -> list[T]:
        """Every rank's `value`, in rank order, on every rank."""
        every: list[T] = [value] * self.world
        dist.all_gather_object(every, value, group=self.group)
        return every

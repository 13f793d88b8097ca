"""The durable local outbox: what a trainer or supervisor wants recorded, kept in SQLite until the log has it.

The log must never stall or kill training. Writers put *intents* here (a local fsync'd SQLite insert), and a
flusher turns each one, in insertion order, into an event decided against the run's state at that moment
(so an intent written while NATS was down still becomes a correctly chained, legal event later).
"""

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import msgspec
import structlog

from events.schema import AnyEvent, Checkpointed, Completed, Failed, now
from projections.lifecycle import CheckpointRef, RunState, corrupt_skipped_event, restart_event, resumed_event


class CheckpointIntent(msgspec.Struct, frozen=True, kw_only=True, tag="checkpoint"):
    """A checkpoint was finalized (manifest + marker in place): record `checkpointed`."""

    step: int
    epoch: int
    shards: int
    uri: str
    checkpoint_hash: str
    size_bytes: int


class SkipIntent(msgspec.Struct, frozen=True, kw_only=True, tag="skip"):
    """The checkpoint with this manifest digest failed verification: record `corrupt_skipped`."""

    checkpoint_hash: str
    step: int
    reason: str


class ResumeIntent(msgspec.Struct, frozen=True, kw_only=True, tag="resume"):
    """Training restarted from the checkpoint with this digest (None: from step 0, none ever existed)."""

    checkpoint_hash: str | None
    step: int


class FailIntent(msgspec.Struct, frozen=True, kw_only=True, tag="fail"):
    """The training job stopped abnormally: record `failed`."""

    reason: str
    exit_code: int | None = None
    message: str = ""


class CompleteIntent(msgspec.Struct, frozen=True, kw_only=True, tag="complete"):
    """The training job finished: record `completed` (GPU-hours reported, or wall time × GPUs when None)."""

    cost_gpu_hours: float | None = None


Intent = CheckpointIntent | SkipIntent | ResumeIntent | FailIntent | CompleteIntent

SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    row_id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, intent_id TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS pending_by_run ON pending (run_id, row_id);
CREATE TABLE IF NOT EXISTS rejected (
    row_id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, intent_id TEXT NOT NULL, created_at TEXT NOT NULL,
    body BLOB NOT NULL, reason TEXT NOT NULL, rejected_at TEXT NOT NULL);
"""
BUSY_TIMEOUT_S = 30.0
OPEN_ATTEMPTS = 10
log = structlog.get_logger(__name__)

_intent_decoder = msgspec.json.Decoder(Intent)
_encoder = msgspec.json.Encoder()


class PendingIntent(msgspec.Struct, frozen=True):
    """One row of the outbox: an intent not yet in the log. `intent_id` becomes the event's `id`."""

    row_id: int
    run_id: str
    intent_id: str
    created_at: datetime
    intent: Intent


class RejectedIntent(msgspec.Struct, frozen=True):
    """An intent the fold refused, kept for inspection instead of being retried forever."""

    row_id: int
    run_id: str
    intent_id: str
    created_at: datetime
    intent: Intent | None
    reason: str


def outbox_path(home: Path) -> Path:
    """One outbox per ftrain home, shared by every process of the node (supervisor, trainer rank 0)."""
    return home / "outbox.sqlite"


class Outbox:
    """The outbox file, through one synchronous SQLite connection: it is written from training threads.

    WAL with `synchronous=FULL`, so a `put` that returned survives a power cut; a busy timeout, so
    several processes of one node share the file. Safe to share between threads of one process.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        for attempt in range(OPEN_ATTEMPTS):
            try:  # switching a new file to WAL can be refused while another process creates it too
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(SCHEMA)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == OPEN_ATTEMPTS - 1:
                    self._db.close()
                    raise
                time.sleep(0.05 * (attempt + 1))

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    def put(self, run_id: str, intent: Intent) -> str:
        """Append `intent` for `run_id`; committed (fsynced) when this returns. Returns the intent id."""
        intent_id = uuid.uuid4().hex
        with self._lock:
            self._db.execute(
                "INSERT INTO pending (run_id, intent_id, created_at, body) VALUES (?, ?, ?, ?)",
                (run_id, intent_id, now().isoformat(), _encoder.encode(intent)),
            )
        return intent_id

    def pending(self, run_id: str) -> list[PendingIntent]:
        """The run's intents not yet in the log, oldest first.

        A row this version cannot decode (written by a newer ftrain sharing the file) is rejected, never
        left to block the rows behind it."""
        with self._lock:
            rows = self._db.execute(
                "SELECT row_id, run_id, intent_id, created_at, body FROM pending WHERE run_id = ? "
                "ORDER BY row_id",
                (run_id,),
            ).fetchall()
        out = []
        for row_id, run, intent_id, created_at, body in rows:
            try:
                intent = _intent_decoder.decode(body)
            except msgspec.DecodeError as exc:
                log.error("outbox_intent_undecodable", run_id=run, intent_id=intent_id, error=str(exc))
                self.reject(row_id, f"undecodable intent: {exc}")
                continue
            out.append(PendingIntent(row_id, run, intent_id, datetime.fromisoformat(created_at), intent))
        return out

    def done(self, row_id: int) -> None:
        """The row's event is in the log: forget the row."""
        with self._lock:
            self._db.execute("DELETE FROM pending WHERE row_id = ?", (row_id,))

    def reject(self, row_id: int, why: str) -> None:
        """Move the row to `rejected` with the reason, in one transaction."""
        with self._transaction():
            self._db.execute(
                "INSERT OR IGNORE INTO rejected SELECT row_id, run_id, intent_id, created_at, body, ?, ? "
                "FROM pending WHERE row_id = ?",
                (why, now().isoformat(), row_id),
            )
            self._db.execute("DELETE FROM pending WHERE row_id = ?", (row_id,))

    def rejected(self, run_id: str) -> list[RejectedIntent]:
        """The run's refused intents, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT row_id, run_id, intent_id, created_at, body, reason FROM rejected WHERE run_id = ? "
                "ORDER BY row_id",
                (run_id,),
            ).fetchall()
        out = []
        for row_id, run, intent_id, created_at, body, reason in rows:
            try:
                intent: Intent | None = _intent_decoder.decode(body)
            except msgspec.DecodeError:
                intent = None
            created = datetime.fromisoformat(created_at)
            out.append(RejectedIntent(row_id, run, intent_id, created, intent, reason))
        return out

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")


# -- deciding: pure, no I/O -----------------------------------------------------------------------------------


def completed_event(state: RunState, cost_gpu_hours: float | None, at: datetime) -> Completed:
    """`completed` as of `at`: the reported GPU-hours, else running wall time × GPUs."""
    return Completed(
        run_id=state.run_id,
        cost_gpu_hours=cost_gpu_hours if cost_gpu_hours is not None else state.gpu_hours_at(at),
        running_seconds=state.running_seconds_at(at),
        cost_source="reported" if cost_gpu_hours is not None else "wall-time",
    )


def decide(state: RunState, intent: Intent, intent_id: str, at: datetime) -> AnyEvent | None:
    """The event that records `intent` against the run's current state, or None when the state already
    reflects it (an intent retried after its event landed). Stamped with the intent's id and time, so a
    retried append is deduplicated and the log says when it happened, not when the log was reachable.

    Never judges legality: an intent that cannot apply still becomes its event, for `check` to refuse."""
    event = _event(state, intent, at)
    return None if event is None else msgspec.structs.replace(event, id=intent_id, time=at)


def _event(state: RunState, intent: Intent, at: datetime) -> AnyEvent | None:
    running = state.status == "running"
    if isinstance(intent, CheckpointIntent):
        if _by_hash(state, intent.checkpoint_hash) is not None:
            return None
        return Checkpointed(
            run_id=state.run_id,
            step=intent.step,
            epoch=intent.epoch,
            shards=intent.shards,
            uri=intent.uri,
            checkpoint_hash=intent.checkpoint_hash,
            size_bytes=intent.size_bytes,
        )
    if isinstance(intent, SkipIntent):
        ref = _by_hash(state, intent.checkpoint_hash) or _unknown(intent.checkpoint_hash, intent.step, at)
        return None if ref.status == "corrupt" else corrupt_skipped_event(state, ref, intent.reason)
    if isinstance(intent, ResumeIntent):
        if intent.checkpoint_hash is None:
            return restart_event(state, forced=running)
        # built for the named checkpoint even when it is not the newest valid one: `check` refuses it then,
        # rather than the run silently resuming from a checkpoint the trainer did not load
        ref = _by_hash(state, intent.checkpoint_hash) or _unknown(intent.checkpoint_hash, intent.step, at)
        return resumed_event(state, ref, forced=running)
    if isinstance(intent, FailIntent):
        if not running:  # a failure of a stopped run is no transition
            return None
        return Failed(
            run_id=state.run_id, reason=intent.reason, exit_code=intent.exit_code, message=intent.message
        )
    return None if state.status == "completed" else completed_event(state, intent.cost_gpu_hours, at)


def _by_hash(state: RunState, checkpoint_hash: str) -> CheckpointRef | None:
    """The run's checkpoint with this manifest digest, valid or not."""
    return next((c for c in reversed(state.checkpoints) if c.checkpoint_hash == checkpoint_hash), None)


def _unknown(checkpoint_hash: str, step: int, at: datetime) -> CheckpointRef:
    """A checkpoint the log never recorded: seq 0 is no checkpointed event, so `check` refuses what names it."""
    return CheckpointRef(
        seq=0, step=step, epoch=0, shards=1, uri="", checkpoint_hash=checkpoint_hash, size_bytes=0, time=at
    )

"""The durable local outbox: what a trainer or supervisor wants recorded, kept in SQLite until the log has it.

The log must never stall or kill training. Writers put *intents* here (a local fsync'd SQLite insert), and the
recorder (`workers.recorder`) turns each one, in insertion order, into an event decided against the run's state at that moment
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

from ftrain.domain.lifecycle import Intent
from ftrain.events.schema import Actor, now
from ftrain.host.private_files import private_dir, private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    row_id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, intent_id TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL, body BLOB NOT NULL, actor BLOB);
CREATE INDEX IF NOT EXISTS pending_by_run ON pending (run_id, row_id);
CREATE TABLE IF NOT EXISTS rejected (
    row_id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, intent_id TEXT NOT NULL, created_at TEXT NOT NULL,
    body BLOB NOT NULL, reason TEXT NOT NULL, rejected_at TEXT NOT NULL, actor BLOB);
"""
ACTOR_COLUMN = "actor"
"""Who recorded the intent (JSON `Actor`), added after the first release: NULL in older rows and files."""
BUSY_TIMEOUT_S = 30.0
OPEN_ATTEMPTS = 10
log = structlog.get_logger(__name__)

_intent_decoder = msgspec.json.Decoder(Intent)
_actor_decoder = msgspec.json.Decoder(Actor)
_encoder = msgspec.json.Encoder()


class PendingIntent(msgspec.Struct, frozen=True):
    """One row of the outbox: an intent not yet in the log. `intent_id` becomes the event's `id`."""

    row_id: int
    run_id: str
    intent_id: str
    created_at: datetime
    intent: Intent
    actor: Actor | None = None
    """The process that recorded it (None: a row written by an older ftrain); its event carries it, whoever
    delivers it."""


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
        private_dir(
            path.parent
        )  # the ftrain home: 0700; the file 0600 before SQLite opens it (-wal, -shm copy it)
        private_file(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        for attempt in range(OPEN_ATTEMPTS):
            try:  # switching a new file to WAL can be refused while another process creates it too
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(SCHEMA)
                _add_actor_columns(self._db)
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

    def put(self, run_id: str, intent: Intent, actor: Actor | None = None) -> str:
        """Append `intent` for `run_id`, recorded by `actor`; committed (fsynced) when this returns. Returns
        the intent id."""
        intent_id = uuid.uuid4().hex
        recorded_by = None if actor is None else _encoder.encode(actor)
        with self._lock:
            self._db.execute(
                "INSERT INTO pending (run_id, intent_id, created_at, body, actor) VALUES (?, ?, ?, ?, ?)",
                (run_id, intent_id, now().isoformat(), _encoder.encode(intent), recorded_by),
            )
        return intent_id

    def pending(self, run_id: str) -> list[PendingIntent]:
        """The run's intents not yet in the log, oldest first.

        A row this version cannot decode (written by a newer ftrain sharing the file) is rejected, never
        left to block the rows behind it."""
        with self._lock:
            rows = self._db.execute(
                "SELECT row_id, run_id, intent_id, created_at, body, actor FROM pending WHERE run_id = ? "
                "ORDER BY row_id",
                (run_id,),
            ).fetchall()
        out = []
        for row_id, run, intent_id, created_at, body, recorded_by in rows:
            try:
                intent = _intent_decoder.decode(body)
                actor = None if recorded_by is None else _actor_decoder.decode(recorded_by)
            except msgspec.DecodeError as exc:
                log.error("outbox_intent_undecodable", run_id=run, intent_id=intent_id, error=str(exc))
                self.reject(row_id, f"undecodable intent: {exc}")
                continue
            created = datetime.fromisoformat(created_at)
            out.append(PendingIntent(row_id, run, intent_id, created, intent, actor))
        return out

    def done(self, row_id: int) -> None:
        """The row's event is in the log: forget the row."""
        with self._lock:
            self._db.execute("DELETE FROM pending WHERE row_id = ?", (row_id,))

    def reject(self, row_id: int, why: str) -> None:
        """Move the row to `rejected` with the reason, in one transaction."""
        with self._transaction():
            self._db.execute(
                "INSERT OR IGNORE INTO rejected "
                "(row_id, run_id, intent_id, created_at, body, actor, reason, rejected_at) "
                "SELECT row_id, run_id, intent_id, created_at, body, actor, ?, ? FROM pending WHERE row_id = ?",
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


def _add_actor_columns(db: sqlite3.Connection) -> None:
    """Bring a file made by an older ftrain up to date: the `actor` column, NULL in its rows. Several
    processes may open such a file at once; the one that loses the race finds the column there."""
    for table in ("pending", "rejected"):
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if ACTOR_COLUMN not in columns:
            try:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {ACTOR_COLUMN} BLOB")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):
                    raise

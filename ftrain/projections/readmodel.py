"""The SQLite read model: runs, checkpoints, an audit index of every event, and chain breaks.

The last applied stream sequence is stored in the same transaction as the rows it produced, and a batch
commits only if the model is still at the position it was folded at (its stream, its generation of resets,
its last sequence), so applying is exactly-once across crashes, redeliveries and two processes catching up at
once. A reset re-reads, in its own transaction, the state that justifies it, so it never wipes what another
process applied after that decision.

Whose signatures each run's events carry is stored too (`signers`: the run's stretches, `vouching`), never a
verdict: the trust list can change after the fold, so a view judges them against the current one when it
reads. A file of another schema version is emptied and replayed from the log on open (`SCHEMA_VERSION`).
"""

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiosqlite
import msgspec
import structlog
from msgspec import UNSET

from ftrain.domain.chain_walk import Finding
from ftrain.domain.lifecycle import CheckpointRef, RunState
from ftrain.domain.vouching import Stretch, Unvouched, Vouched, judge
from ftrain.events.schema import Checkpointed, DataPosition
from ftrain.events.signing import TrustList
from ftrain.host.private_files import private_dir, private_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, project TEXT NOT NULL, status TEXT NOT NULL,
    updated_at TEXT NOT NULL, state BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS runs_by_project ON runs (project, run_id);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, step INTEGER NOT NULL, epoch INTEGER NOT NULL,
    shards INTEGER NOT NULL, uri TEXT NOT NULL, checkpoint_hash TEXT NOT NULL, size_bytes INTEGER NOT NULL,
    status TEXT NOT NULL, reason TEXT, time TEXT NOT NULL, data TEXT, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS audit (
    stream_seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER, type TEXT NOT NULL, time TEXT,
    actor TEXT, hash TEXT, prev_hash TEXT, status TEXT NOT NULL, reason TEXT);
CREATE TABLE IF NOT EXISTS broken_runs (
    run_id TEXT PRIMARY KEY, stream_seq INTEGER NOT NULL, seq INTEGER, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS signers (
    run_id TEXT NOT NULL, idx INTEGER NOT NULL, stretch TEXT NOT NULL, valid INTEGER,
    PRIMARY KEY (run_id, idx));
CREATE INDEX IF NOT EXISTS signers_unchecked ON signers (run_id, idx) WHERE valid IS NULL;
"""
SCHEMA_VERSION = 4
"""`PRAGMA user_version` of a model this code wrote. 0: before versioning (no `signers`); 1: `signers`; 2:
checkpoints a `checkpointed` retired are `pruned` (a model folded before shows them `valid`: replayed); 3:
a checkpoint's global data position (`data`, JSON or NULL); 4: `snapshot_replicated` folds into the run's
snapshot (a model before could not decode it and held such a run broken: replayed)."""
TABLES = ("runs", "checkpoints", "audit", "broken_runs", "signers")
DEFERRED_INDEX = "audit_by_run"
"""The index of the audit by run: dropped with the rows by a reset and built once the replay that follows is
caught up (`ReadModel.settle`), in one sorted pass rather than row by row. Only lookups use it (`taken`), and
they are exact without it."""
WAL_CHECKPOINT_PAGES = 16384
"""Pages (64 MiB) the write-ahead log may grow to before a commit copies it into the database file; a catch-up
copies it once, when it settles, rather than every 1,000 pages (SQLite's default) with an fsync each time."""
OPEN_ATTEMPTS = 10
log = structlog.get_logger(__name__)

_state_decoder = msgspec.json.Decoder(RunState)
_rows_decoder = msgspec.json.Decoder(list[list[Any]])
_signers_decoder = msgspec.json.Decoder(list[tuple[Stretch, int | None]])
_stretch_decoder = msgspec.json.Decoder(Stretch)
_encoder = msgspec.json.Encoder()


class AuditRow(msgspec.Struct, frozen=True, array_like=True):
    """One row of the audit index, in column order."""

    stream_seq: int
    run_id: str
    seq: int | None
    type: str
    time: str | None
    actor: str | None
    hash: str | None
    prev_hash: str | None
    status: str
    reason: str | None


class Position(msgspec.Struct, frozen=True):
    """Where the model stands. The sequence alone is not enough to compare-and-set on: after a reset by
    another process it comes back to a value a slow projector saw before, over different rows."""

    stream_id: str | None
    generation: int
    last_seq: int


class Batch(msgspec.Struct):
    """What one projector batch changes, written in one transaction."""

    runs: dict[str, RunState] = msgspec.field(default_factory=dict)
    checkpoints: dict[tuple[str, int], CheckpointRef] = msgspec.field(default_factory=dict)
    audit: list[AuditRow] = msgspec.field(default_factory=list)
    broken: dict[str, Finding] = msgspec.field(default_factory=dict)
    signers: dict[tuple[str, int], Stretch] = msgspec.field(default_factory=dict)
    """Each changed stretch by (run, index); written unchecked (`ReadModel.check_signatures` checks it)."""


class StoredRun(msgspec.Struct, frozen=True):
    """A run as the model holds it: its folded state, and the stretches of signers its events carry."""

    state: RunState
    signers: list[Stretch]

    def vouching(self, trust: TrustList) -> Vouched | Unvouched | None:
        """Who vouches for the run under `trust` (the trust list of the moment: never stored). Signers that
        end before the state's head (a model an older ftrain kept folding) vouch for nothing."""
        head = self.state.head
        if not self.signers or self.signers[-1].last_stream_seq != head.stream_seq:
            why = "the read model does not say who signed it (rebuild it: `ftrain replay --rebuild`)"
            return Unvouched(
                head.seq, head.stream_seq, self.signers[-1].last_type if self.signers else "?", why
            )
        return judge(self.signers, trust)


def _set_aside(path: Path, exc: Exception) -> None:
    """Move an unreadable read model (and its WAL files) out of the way so it is rebuilt from the log."""
    target = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
    log.warning("readmodel_unreadable", path=str(path), error=str(exc), moved_to=str(target))
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether an error says the file itself is damaged ("malformed", "not a database"), not busy or full."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _encode_state(state: RunState) -> bytes:
    """The state blob, without the checkpoints: they live in their own table, written only when they change."""
    return _encoder.encode(msgspec.structs.replace(state, checkpoints=()))


def _stretch_text(stretch: Stretch) -> str:
    """A stretch as stored: unchecked (its `valid` lives in its own column, set by `check_signatures`)."""
    return _encoder.encode(msgspec.structs.replace(stretch, valid=None)).decode()


def _checkpoint_ref(run_id: str, row: Sequence[Any]) -> CheckpointRef:
    """A checkpoint from (seq, step, epoch, shards, uri, checkpoint_hash, size_bytes, status, reason, time,
    data)."""
    seq, step, epoch, shards, uri, checkpoint_hash, size_bytes, status, reason, time_text, data = row
    recorded = Checkpointed(
        run_id=run_id,
        seq=seq,
        time=datetime.fromisoformat(time_text),
        step=step,
        epoch=epoch,
        shards=shards,
        uri=uri,
        checkpoint_hash=checkpoint_hash,
        size_bytes=size_bytes,
        data=UNSET if data is None else msgspec.convert(data, DataPosition),
    )
    return CheckpointRef(recorded=recorded, status=status, reason=reason)


async def _migrate(db: aiosqlite.Connection) -> None:
    """Create the schema, once per file. A model another schema version wrote is dropped first (the
    projector then replays the log into the new one: derived data, rebuilt identical); decided again inside
    the transaction, so two processes opening it at once migrate it once."""
    if await _version(db) == SCHEMA_VERSION:
        return
    await db.execute("BEGIN IMMEDIATE")
    try:
        if (version := await _version(db)) != SCHEMA_VERSION:
            async with db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ) as cur:
                old = [str(row[0]) for row in await cur.fetchall()]
            for table in old:
                await db.execute(f'DROP TABLE "{table}"')
            for statement in filter(str.strip, SCHEMA.split(";")):
                await db.execute(statement)
            await db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            if old:
                log.info("readmodel_schema_replaced", version=version, now=SCHEMA_VERSION)
        await db.execute("COMMIT")
    except BaseException:
        await db.execute("ROLLBACK")
        raise


async def _version(db: aiosqlite.Connection) -> int:
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


def _checkpoint_row(run_id: str, c: CheckpointRef) -> tuple[Any, ...]:
    r = c.recorded
    data = None if isinstance(r.data, msgspec.UnsetType) else _encoder.encode(r.data).decode()
    return (run_id, r.seq, r.step, r.epoch, r.shards, r.uri, r.checkpoint_hash, r.size_bytes, c.status, c.reason,
            r.time.isoformat(), data)  # fmt: skip


class ReadModel:
    """An open read-model database."""

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    @classmethod
    async def open(cls, path: Path) -> "ReadModel":
        """Open (creating) the database at `path` in WAL mode.

        The read model is derived data: a file that is not a database any more is set aside and rebuilt
        from the log. Two processes creating it at once can briefly see it locked; that is retried.
        """
        private_dir(
            path.parent
        )  # the ftrain home: 0700; the file 0600 before SQLite opens it (-wal, -shm copy it)
        for attempt in range(OPEN_ATTEMPTS):
            private_file(path)
            db = await aiosqlite.connect(path, timeout=30.0, isolation_level=None)
            try:
                await db.execute("PRAGMA journal_mode=WAL")
                await db.execute("PRAGMA synchronous=NORMAL")
                await db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
                await _migrate(db)
                return cls(db, path)
            except sqlite3.OperationalError as exc:
                await db.close()
                if "locked" not in str(exc) or attempt == OPEN_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
            except sqlite3.DatabaseError as exc:
                await db.close()
                _set_aside(path, exc)
        raise sqlite3.OperationalError(f"could not open the read model {path}")

    async def replace_damaged(self, exc: sqlite3.DatabaseError) -> None:
        """Set this damaged file aside (one warning) and continue on a fresh, empty one at the same path."""
        await self._db.close()
        _set_aside(self.path, exc)
        self._db = (await ReadModel.open(self.path))._db

    async def close(self) -> None:
        """Close the connection."""
        await self._db.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def last_seq(self) -> int:
        """The last stream sequence applied."""
        return (await self.position()).last_seq

    async def position(self) -> Position:
        """The model's position, as of one snapshot."""
        meta = dict(await self._fetch("SELECT key, value FROM meta"))
        return Position(meta.get("stream_id"), int(meta.get("generation", 0)), int(meta.get("last_seq", 0)))

    async def rebind(self, stream_id: str) -> bool:
        """Empty every view and bind the model to `stream_id`, only if it is still bound to another stream."""
        return await self._reset_if(stream_id, lambda at: at.stream_id != stream_id)

    async def rebuild(self, stream_id: str, generation: int) -> bool:
        """Empty every view and bind the model to `stream_id`, only if no reset happened since `generation`
        (one that did replays the stream for this rebuild too)."""
        return await self._reset_if(stream_id, lambda at: at.generation == generation)

    async def _reset_if(self, stream_id: str, due: Callable[[Position], bool]) -> bool:
        """Reset if `due(position)`, deciding on the position this transaction reads: a decision made on an
        earlier reading could wipe what another process applied since, and apply it all again."""
        db = self._db
        await db.execute("BEGIN IMMEDIATE")
        try:
            at = await self.position()
            if not due(at):
                await db.execute("ROLLBACK")
                return False
            for table in (*TABLES, "meta"):
                await db.execute(f"DELETE FROM {table}")
            await db.execute(f"DROP INDEX IF EXISTS {DEFERRED_INDEX}")  # the replay that follows builds it
            await db.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [("last_seq", "0"), ("stream_id", stream_id), ("generation", str(at.generation + 1))],
            )
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
        return True

    async def commit(self, expected: Position, new_last: int, batch: Batch) -> bool:
        """Write `batch` and advance last_seq to `new_last`, unless the model moved from `expected`: another
        process applied past it, reset the model or bound it to another stream."""
        db = self._db
        await db.execute("BEGIN IMMEDIATE")
        try:
            if await self.position() != expected:
                await db.execute("ROLLBACK")
                return False
            await db.executemany(
                "INSERT OR REPLACE INTO runs (run_id, project, status, updated_at, state) VALUES (?, ?, ?, ?, ?)",
                [
                    (s.run_id, s.project, s.status, s.updated_at.isoformat(), _encode_state(s))
                    for s in batch.runs.values()
                ],
            )
            await db.executemany(
                "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [_checkpoint_row(run_id, c) for (run_id, _), c in batch.checkpoints.items()],
            )
            await db.executemany(
                "INSERT OR REPLACE INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [msgspec.structs.astuple(row) for row in batch.audit],
            )
            await db.executemany(
                "INSERT OR IGNORE INTO broken_runs VALUES (?, ?, ?, ?)",
                [(f.run_id, f.stream_seq, f.seq, f.reason) for f in batch.broken.values()],
            )
            await db.executemany(
                "INSERT OR REPLACE INTO signers VALUES (?, ?, ?, NULL)",
                [(run_id, idx, _stretch_text(s)) for (run_id, idx), s in batch.signers.items()],
            )
            await db.execute("UPDATE meta SET value = ? WHERE key = 'last_seq'", (str(new_last),))
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
        return True

    async def settle(self) -> None:
        """Once caught up: build the index a reset dropped (a no-op, taking no lock, where it exists) and copy
        the write-ahead log into the database file (without waiting for readers; nothing to do where a
        catch-up applied nothing)."""
        await self._db.execute(f"CREATE INDEX IF NOT EXISTS {DEFERRED_INDEX} ON audit (run_id, seq)")
        await self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    async def run(self, run_id: str) -> RunState | None:
        """The folded state of one run."""
        stored = (await self.stored_runs_of([run_id])).get(run_id)
        return stored.state if stored else None

    async def runs(self, project: str | None = None) -> list[RunState]:
        """All runs, or one project's, ordered by run id."""
        return [r.state for r in await self.stored_runs(project)]

    async def stored_runs_of(self, run_ids: Iterable[str]) -> dict[str, StoredRun]:
        """Several runs at once, with their signers (missing ones are absent)."""
        ids = list(run_ids)
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        return await self._stored(f"WHERE run_id IN ({marks})", ids)

    async def stored_runs(self, project: str | None = None) -> list[StoredRun]:
        """All runs, or one project's, with their signers, ordered by run id."""
        where, args = ("WHERE project = ?", (project,)) if project is not None else ("", ())
        return sorted((await self._stored(where, args)).values(), key=lambda r: r.state.run_id)

    async def _stored(self, where: str, args: Sequence[Any]) -> dict[str, StoredRun]:
        """Runs matching `where` on the runs table, each with its checkpoints in log order and its signers.

        One statement, so one snapshot: another process may commit between two separate reads."""
        query = (
            "SELECT r.state, (SELECT json_group_array(json_array(c.seq, c.step, c.epoch, c.shards, c.uri, "
            "c.checkpoint_hash, c.size_bytes, c.status, c.reason, c.time, json(c.data))) FROM "
            "(SELECT * FROM checkpoints WHERE run_id = r.run_id ORDER BY seq) AS c), "
            "(SELECT json_group_array(json_array(json(s.stretch), s.valid)) FROM "
            f"(SELECT * FROM signers WHERE run_id = r.run_id ORDER BY idx) AS s) FROM runs AS r {where}"
        )
        stored = {}
        for blob, refs, signers in await self._fetch(query, args):
            state = _state_decoder.decode(blob)
            checkpoints = tuple(_checkpoint_ref(state.run_id, row) for row in _rows_decoder.decode(refs))
            stretches = [
                msgspec.structs.replace(s, valid=None if valid is None else bool(valid))
                for s, valid in _signers_decoder.decode(signers)
            ]
            stored[state.run_id] = StoredRun(
                msgspec.structs.replace(state, checkpoints=checkpoints), stretches
            )
        return stored

    async def check_signatures(self) -> None:
        """Verify the newest signature of every stretch folded since the last check, and store the result.
        Once per catch-up rather than per batch: a rebuild checks each run about once, not once per batch
        that touched it. A stretch another process changed meanwhile is left to that process."""
        unchecked = await self._fetch("SELECT run_id, idx, stretch FROM signers WHERE valid IS NULL")
        if not unchecked:
            return
        checked = [
            (_stretch_decoder.decode(text).verifies(), run_id, idx, text) for run_id, idx, text in unchecked
        ]
        db = self._db
        await db.execute("BEGIN IMMEDIATE")
        try:
            await db.executemany(
                "UPDATE signers SET valid = ? WHERE run_id = ? AND idx = ? AND stretch = ? AND valid IS NULL",
                checked,
            )
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise

    async def hash_at(self, stream_seq: int) -> str | None:
        """The chain hash the model recorded for the event at `stream_seq` (None: none, or it was rejected)."""
        rows = await self._fetch("SELECT hash FROM audit WHERE stream_seq = ?", (stream_seq,))
        return None if not rows or rows[0][0] is None else str(rows[0][0])

    async def taken(self, run_id: str) -> bool:
        """Whether any event, accepted or not, was ever stored for `run_id`."""
        return bool(await self._fetch("SELECT 1 FROM audit WHERE run_id = ? LIMIT 1", (run_id,)))

    async def broken(self, run_id: str) -> Finding | None:
        """The first chain or state-machine break recorded for a run."""
        return (await self._findings("WHERE b.run_id = ?", (run_id,))).get(run_id)

    async def broken_runs(self) -> dict[str, Finding]:
        """Every run with a recorded break, with its first break (also runs none of whose events was accepted)."""
        return await self._findings("", ())

    async def _findings(self, where: str, args: Sequence[Any]) -> dict[str, Finding]:
        rows = await self._fetch(
            "SELECT b.run_id, b.stream_seq, b.seq, COALESCE(a.type, '?'), b.reason FROM broken_runs b "
            f"LEFT JOIN audit a ON a.stream_seq = b.stream_seq {where}",
            args,
        )
        return {row[0]: Finding(*row) for row in rows}

    async def broken_run_ids(self) -> set[str]:
        """Every run with a recorded break."""
        return {str(r[0]) for r in await self._fetch("SELECT run_id FROM broken_runs")}

    async def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every view, ordered: two models built from one log must dump equal."""
        return {t: await self._fetch(f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}

    async def _fetch(self, query: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self._db.execute(query, args) as cur:
            return [tuple(r) for r in await cur.fetchall()]

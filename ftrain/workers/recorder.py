"""The outbox worker: trainers and the supervisor record lifecycle transitions without ever waiting on the log.

`record` is a local SQLite commit into the outbox. A daemon thread, with its own event loop and NATS
connection, delivers the run's pending intents to the log in order, each decided against the run's own log
(`domain.command_handler.RunLog`); while the log is unreachable it backs off and retries forever. Nothing the
log does reaches the training thread: the log must never stall or kill training.

Trainers and the supervisor hold it as `Recording`, the port they record through: what they may ask of it,
without its thread or its file.
"""

import asyncio
import contextlib
import fcntl
import os
import threading
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

import msgspec
import nats.errors
import structlog

from ftrain.domain.command_handler import BrokenRun, ContendedRun, RunLog
from ftrain.domain.lifecycle import IllegalTransition, Intent, RunState, decide_intent
from ftrain.events.chain import unseal
from ftrain.events.jetstream.connection import NatsSettings, open_store
from ftrain.events.jetstream.nats_server import NatsServerError
from ftrain.events.log_port import LogUnavailable
from ftrain.events.schema import AnyEvent
from ftrain.events.signed_log import process_actor
from ftrain.workers.outbox import Outbox, PendingIntent, outbox_path

PERIOD_S = 1.0
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 5.0
POLL_S = 0.02
STOP_WAIT_S = 5.0
UNREACHABLE = (LogUnavailable, NatsServerError, nats.errors.Error, OSError)  # OSError covers TimeoutError
TRANSIENT = (*UNREACHABLE, ContendedRun)
"""What keeps intents waiting in the outbox, to be retried: refusing an intent for it would lose its event."""
log = structlog.get_logger(__name__)


@contextlib.asynccontextmanager
async def sole_deliverer(outbox: Outbox) -> AsyncIterator[None]:
    """Hold the outbox file's delivery lock. Two deliverers of one run (supervisor and trainer share the
    file) would otherwise race: one could decide a row the other has appended but not yet marked done."""
    fd = os.open(f"{outbox.path}.deliver-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(POLL_S)  # never block the loop: the holder may be this process
        yield
    finally:
        os.close(fd)  # releases the lock


class _EventId(msgspec.Struct):
    """Just the id of a stored event: enough to recognise our own, whatever its type or version."""

    id: str = ""


async def in_log(run_log: RunLog, event_id: str) -> bool:
    """Whether the run's log holds the event with this id."""
    async for records in run_log.store.read(1, run_id=run_log.run_id):
        for record in records:
            parts = unseal(record.payload)
            with contextlib.suppress(msgspec.DecodeError):  # not ours, whatever it is
                if parts is not None and msgspec.json.decode(parts[0], type=_EventId).id == event_id:
                    return True
    return False


def _decided(state: RunState | None, row: PendingIntent) -> AnyEvent | None:
    """The row's event against the run's state, carrying the actor that recorded it (when the row says)."""
    if state is None:
        raise IllegalTransition("the log has no such run")
    event = decide_intent(state, row.intent, row.intent_id, row.created_at)
    return event if event is None or row.actor is None else msgspec.structs.replace(event, actor=row.actor)


async def deliver(run_log: RunLog, outbox: Outbox) -> int:
    """Append the run's pending intents, oldest first; returns how many events were appended.

    A row is marked done only once its event is in the log, and rows are appended one at a time, so only the
    oldest pending row can be in the log already (a crash, or a lost ack, between append and done): it is
    looked up by id, since re-deciding it against a state that moved on could record it twice. An intent the
    judge refuses, or a broken run's, is moved to `rejected`. The log's errors, and a run other writers keep
    appending to, propagate, leaving the rest pending, in order."""
    appended = 0
    run_id = run_log.run_id
    async with sole_deliverer(outbox):
        rows = outbox.pending(run_id)
        if rows and await in_log(run_log, rows[0].intent_id):
            outbox.done(rows.pop(0).row_id)
        for row in rows:
            try:
                event = await run_log.append(partial(_decided, row=row))
            except (IllegalTransition, BrokenRun) as exc:
                log.error(
                    "outbox_intent_rejected",
                    run_id=run_id,
                    intent_id=row.intent_id,
                    intent=msgspec.to_builtins(row.intent),
                    reason=str(exc),
                )
                outbox.reject(row.row_id, str(exc))
                continue
            outbox.done(row.row_id)
            appended += event is not None
    return appended


class Recording(Protocol):
    """The recording port: one run's lifecycle intents recorded at once, in the log when it answers."""

    def record(self, intent: Intent) -> str:
        """Keep `intent` durably until the log has it; returns its id, which becomes the event's. Never waits
        on the log."""
        ...

    def flush(self, timeout: float) -> bool:
        """Wait until no intent of the run is left waiting (each in the log, or refused and set aside): True,
        or False after `timeout` seconds."""
        ...


class Recorder:
    """Records one run's lifecycle intents from training code: durable at once, in the log when it answers."""

    def __init__(self, run_id: str, settings: NatsSettings, rank: int | None = None) -> None:
        """`rank`: the training rank recording (stamped on the events it appends); None for the supervisor."""
        self.run_id = run_id
        self._rank = rank
        self._actor = process_actor(rank)
        self._settings = settings
        self._outbox = Outbox(outbox_path(settings.home))
        self._wake = asyncio.Event()
        self._stop = threading.Event()
        self._closing = threading.Lock()
        self._flushed_at_close: bool | None = None
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(self._serve())
        self._thread = threading.Thread(target=self._run, name=f"ftrain-recorder-{run_id}", daemon=True)
        self._thread.start()

    @property
    def outbox_file(self) -> Path:
        """Where the intents wait until the log has them."""
        return self._outbox.path

    def record(self, intent: Intent) -> str:
        """Put `intent` in the outbox (committed and fsynced on return) and wake the appender; returns the
        intent id, which becomes the event's id. Never touches NATS; raises only if the local file fails."""
        intent_id = self._outbox.put(self.run_id, intent, self._actor)
        self._poke()
        return intent_id

    def flush(self, timeout: float) -> bool:
        """Wait until no intent of this run is pending (each appended, or refused and set aside): True, or
        False after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        self._poke()
        while self._outbox.pending(self.run_id):
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            time.sleep(POLL_S)
        return True

    def close(self, timeout: float = 10.0) -> bool:
        """Flush for up to `timeout` seconds, then stop the appender. Idempotent; returns the flush result.
        Intents still pending stay in the outbox for the next recorder of the run."""
        with self._closing:
            if self._flushed_at_close is None:
                self._flushed_at_close = self.flush(timeout)
                self._stop.set()  # asyncio.wait_for (3.11) can swallow a cancel; the flag cannot be missed
                self._poke()
                with contextlib.suppress(RuntimeError):  # the loop already stopped
                    self._loop.call_soon_threadsafe(self._task.cancel)
                self._thread.join(STOP_WAIT_S)
                self._outbox.close()
            return self._flushed_at_close

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _poke(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the rows wait for the next recorder
            self._loop.call_soon_threadsafe(self._wake.set)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._task)
        # what the client left behind (a subscription's reader task, cancelled by its close but not yet run
        # to its end) is finished here, as asyncio.run does: a loop closed under a pending task prints
        # "Task was destroyed but it is pending!" on stderr at exit, after the command's last line
        left = asyncio.all_tasks(self._loop)
        for task in left:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _idle(self) -> None:
        """Until `record` (or `flush`) wakes us, or PERIOD_S passes: rows of other processes are found too."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PERIOD_S):
                await self._wake.wait()
        self._wake.clear()

    async def _serve(self) -> None:
        """Deliver whenever there is something to append, connecting only then; while that fails, back off
        (0.5 s doubling to 5 s) and retry, forever. Only `close` ends it."""
        outbox = Outbox(self._outbox.path)  # this thread's own connection
        backoff = 0.0  # > 0 while delivering fails
        try:
            while not self._stop.is_set():
                await (asyncio.sleep(backoff) if backoff else self._idle())
                try:
                    if not outbox.pending(self.run_id):
                        backoff = 0.0  # another process delivered them
                        continue
                    async with open_store(self._settings, rank=self._rank) as store:
                        await store.ensure_stream()
                        run_log = RunLog(store, self.run_id)
                        while not self._stop.is_set():
                            await deliver(run_log, outbox)
                            if backoff:
                                log.info("event_log_reachable", run_id=self.run_id)
                                backoff = 0.0
                            await self._idle()
                except Exception as exc:
                    if not backoff:  # once per outage
                        self._report(exc)
                    backoff = min(backoff * 2, BACKOFF_MAX_S) if backoff else BACKOFF_MIN_S
        finally:
            outbox.close()

    def _report(self, exc: Exception) -> None:
        if isinstance(exc, TRANSIENT):
            log.warning(
                "event_log_unreachable_intents_kept"
                if isinstance(exc, UNREACHABLE)
                else "run_contended_intents_kept",
                run_id=self.run_id,
                outbox=str(self._outbox.path),
                error=f"{type(exc).__name__}: {exc}",
            )
        else:
            log.error("outbox_delivery_failed", run_id=self.run_id, exc_info=exc)

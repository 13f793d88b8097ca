"""The supervisor's tracker feed: a thread that turns the run's new log events into tracker writes.

The outbox rule, as the log's own outbox keeps it: training never waits on the tracker. The feed reads the
run from the log every `interval` seconds, delivers what lies past its cursor in seq order, and advances the
cursor per write taken; a tracker that is down is retried with a growing pause (up to `MAX_BACKOFF_S`), and
what it still lacks stays in the log for the next tick, or the next supervisor of the run. Each tick handles at
most `BATCH` events, so a long outage costs bounded memory and time. Closing flushes for a bounded time."""

import asyncio
import threading
import time
from collections.abc import Mapping
from typing import Self

import structlog

from ftrain.events.schema import AnyEvent
from ftrain.service import RunService
from ftrain.service.run_queries import RunView
from ftrain.trackers.cursor import Cursors
from ftrain.trackers.lifecycle import run_tags, writes
from ftrain.trackers.tracker_port import Tracker, TrackerDown

INTERVAL_S = 5.0
MAX_BACKOFF_S = 60.0
BATCH = 200
FLUSH_S = 10.0
log = structlog.get_logger(__name__)


class TrackerFeed:
    """Feeds run `run_id`'s lifecycle to `tracker` from a daemon thread until closed."""

    def __init__(
        self,
        run_id: str,
        tracker: Tracker,
        cursors: Cursors,
        env: Mapping[str, str],
        interval: float = INTERVAL_S,
    ) -> None:
        self.run_id = run_id
        self.tracker = tracker
        self.cursors = cursors
        self.env = env
        self.interval = interval
        self.down: str | None = None
        """Why the last delivery failed (None: the last one went through)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tracker-{tracker.name}", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self, flush: float = FLUSH_S) -> None:
        """Stop, after one last delivery of what the log holds now, waiting at most `flush` seconds."""
        self._stop.set()
        self._thread.join(flush)
        if self._thread.is_alive():
            log.warning("tracker_flush_timed_out", tracker=self.tracker.name, run_id=self.run_id)
        else:
            self.cursors.close()

    def _loop(self) -> None:
        pause = self.interval
        while not self._stop.wait(pause):
            pause = (
                self.interval
                if self.tick(time.monotonic() + MAX_BACKOFF_S)
                else min(pause * 2, MAX_BACKOFF_S)
            )
        self.tick(time.monotonic() + FLUSH_S)

    def tick(self, deadline: float) -> bool:
        """Deliver what the tracker lacks, until `deadline`; False when the log or the tracker failed."""
        try:
            view, events = asyncio.run(self._read())
        except Exception as exc:
            log.warning("tracker_feed_log_unreadable", run_id=self.run_id, error=str(exc))
            return False
        done = self.cursors.delivered(self.run_id, self.tracker.name)
        for write in writes(events, run_tags(view), done, BATCH):
            if time.monotonic() > deadline:
                return True
            try:
                self.tracker.write(write)
            except TrackerDown as exc:
                if self.down is None:
                    log.warning("tracker_down", tracker=self.tracker.name, run_id=self.run_id, error=str(exc))
                self.down = str(exc)
                return False
            if self.down is not None:
                log.info("tracker_back", tracker=self.tracker.name, run_id=self.run_id)
                self.down = None
            self.cursors.advance(self.run_id, self.tracker.name, write.seq)
        return True

    async def _read(self) -> tuple[RunView, list[AnyEvent]]:
        async with RunService.open(self.env) as app:
            view = await app.view(self.run_id)
            return view, [e.event for e in await app.timeline(self.run_id) if e.event is not None]

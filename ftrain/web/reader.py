"""What the pages show, read through the application service: the read model caught up to the log (as every
query does) for the runs, and the stream's records walked for each run's events and verdicts.

Read only: the service's query methods and the store's reads, never an append. The stream is walked once, in
order, and then only what landed since (as `events tail --follow` and the metrics' scrape do), so neither a
10,000-event run nor a log of 1,000 runs is re-read each time a page refreshes; each record's own signature
is checked only when a page shows it, once; a run's audit is redone only when the stream has grown. A stream
that went back (re-created, accepted by `server repair`) is walked again from its start.
"""

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from ftrain.auditor import AuditReport
from ftrain.domain.chain_walk import ChainWalk
from ftrain.errors import NotFound
from ftrain.events.schema import AnyEvent, now
from ftrain.projections.event_verdict import EventVerdict, Judged, judged, signed
from ftrain.projections.goodput import attempt_spans, measure
from ftrain.service import RunService
from ftrain.service.run_queries import RunView
from ftrain.web.pages import EVENTS_SHOWN, RunDetail

if TYPE_CHECKING:
    from ftrain.metrics.scrape import Scraper


@dataclass
class _Walked:
    """One run's records so far, as the walk judged them, and what the pages derived from them."""

    records: list[Judged] = field(default_factory=list)
    signed: dict[int, EventVerdict] = field(default_factory=dict)
    audit: tuple[int, AuditReport] | None = None

    def accepted(self) -> list[AnyEvent]:
        return [j.event for j in self.records if j.ok and j.event is not None]


class Reader:
    """Reads for the pages, one at a time (the server's threads share one connection and one read model)."""

    def __init__(self, app: RunService) -> None:
        self._app = app
        self._lock = asyncio.Lock()
        self._walk, self._next = ChainWalk(), 1
        self._runs: defaultdict[str, _Walked] = defaultdict(_Walked)
        self._scraper: Scraper | None = None

    async def last_seq(self) -> int:
        """The stream's last sequence: what the live updates watch."""
        return await self._app.store.last_seq()

    async def runs(self) -> list[RunView]:
        """Every run as `ftrain list` judges it, each with its goodput as of now."""
        async with self._lock:
            views = await self._app.views()
            await self._caught_up()
            return [self._with_goodput(v) for v in views]

    async def run(self, run_id: str, every: bool = False) -> RunDetail:
        """One run's page (its newest EVENTS_SHOWN events signed, or `every` one); NotFound when the log has
        never heard of it."""
        async with self._lock:
            views = {v.run_id: v for v in await self._app.views()}
            if run_id not in views:
                raise NotFound(f"unknown run {run_id!r}")
            await self._caught_up()
            view, walked = self._with_goodput(views[run_id]), self._walked(run_id)
            last = await self._app.store.last_seq()
            if walked.audit is None or walked.audit[0] != last:
                walked.audit = (last, await self._app.verify(run_id))
            accepted = walked.accepted()
            spans = attempt_spans(accepted) if view.state is not None and accepted else []
            newest = walked.records[::-1] if every else walked.records[: -EVENTS_SHOWN - 1 : -1]
            shown = [self._signed(walked, j) for j in newest]
            return RunDetail(view, list(walked.records), shown, spans, walked.audit[1])

    async def event(self, run_id: str, stream_seq: int) -> EventVerdict:
        """One record of the run, with both verdicts; NotFound when the run has no record there."""
        async with self._lock:
            if run_id not in {v.run_id for v in await self._app.views()}:
                raise NotFound(f"unknown run {run_id!r}")
            await self._caught_up()
            walked = self._walked(run_id)
            found = next((j for j in walked.records if j.stream_seq == stream_seq), None)
            if found is None:
                raise NotFound(f"run {run_id!r} has no event at stream seq {stream_seq}")
            return self._signed(walked, found)

    async def metrics(self, accept: str | None) -> tuple[bytes, str]:
        """The Prometheus exposition of every run, as `ftrain metrics` serves it, and its content type."""
        from ftrain.metrics.scrape import Scraper  # prometheus_client: loaded by the first scrape only

        async with self._lock:
            if self._scraper is None:
                self._scraper = Scraper(self._app)
            return await self._scraper(accept)

    def _with_goodput(self, view: RunView) -> RunView:
        if view.state is None:
            return view
        accepted = self._walked(view.run_id).accepted()
        return msgspec.structs.replace(view, goodput=measure(accepted, now())) if accepted else view

    async def _caught_up(self) -> None:
        """Read the stream on from where the last read stopped, each record to its run."""
        if await self._app.store.last_seq() < self._next - 1:  # the stream went back: walk it anew
            self._walk, self._next = ChainWalk(), 1
            self._runs.clear()
        async for records in self._app.store.read(self._next):
            for record in records:
                self._runs[record.run_id].records.append(judged(self._walk, record))
            self._next = records[-1].stream_seq + 1

    def _walked(self, run_id: str) -> _Walked:
        """The run's records as walked so far (none for a name the stream never held)."""
        return self._runs[run_id] if run_id in self._runs else _Walked()

    def _signed(self, walked: _Walked, record: Judged) -> EventVerdict:
        """The record with its own signature checked, once."""
        found = walked.signed.get(record.stream_seq)
        if found is None:
            found = walked.signed[record.stream_seq] = signed(record, self._app.store.trust)
        return found

"""Reading the log back as an auditor would: every chain re-verified from the stream, and the timeline.

Neither touches the read model: both walk the stored records themselves, so they check what the projection
was built from rather than trusting it.
"""

from collections.abc import AsyncIterator

import msgspec

from events.jetstream.store import EventStore
from events.schema import AnyEvent
from projections.audit import ChainWalk, Finding


class AuditReport(msgspec.Struct, frozen=True):
    """`audit verify`: events checked, runs seen, and the first break of each broken run."""

    events: int
    runs: int
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        """True when every chain verified."""
        return not self.findings


class TimelineEntry(msgspec.Struct, frozen=True):
    """One record of `replay`: the event when it folded, or the break it caused."""

    stream_seq: int
    run_id: str
    event_type: str
    event: AnyEvent | None
    hash: str | None
    finding: Finding | None


async def verify(store: EventStore, run_id: str | None = None) -> AuditReport:
    """Re-verify every chain from the stream itself: hashes, links, sequence, and legal transitions."""
    walk, events = ChainWalk(), 0
    async for records in store.read(1, run_id=run_id):
        for record in records:
            walk.feed(record)
        events += len(records)
    return AuditReport(events, len(walk.states.keys() | walk.broken), list(walk.findings.values()))


async def timeline(store: EventStore, run_id: str | None = None) -> AsyncIterator[TimelineEntry]:
    """Every event in stream order, each with its verdict."""
    walk = ChainWalk()
    async for records in store.read(1, run_id=run_id):
        for record in records:
            outcome = walk.feed(record)
            if isinstance(outcome, Finding):
                yield TimelineEntry(record.stream_seq, record.run_id, record.event_type, None, None, outcome)
            else:
                yield TimelineEntry(
                    record.stream_seq, record.run_id, record.event_type, outcome.event, outcome.hash, None
                )

"""The projector: folds the stream into the read model, from its last applied sequence to the stream's end."""

import structlog

from events.schema import AnyEvent, Checkpointed, CorruptSkipped
from events.store import EventStore, StoredRecord
from projections.audit import ChainWalk, Finding, Folded
from projections.readmodel import AuditRow, Batch, ReadModel
from projections.state import RunState

log = structlog.get_logger(__name__)


def _accepted_row(record: StoredRecord, folded: Folded) -> AuditRow:
    event: AnyEvent = folded.event
    actor = event.actor
    who = (
        f"{actor.user}@{actor.host}:{actor.pid}" + (f"/rank{actor.rank}" if actor.rank is not None else "")
        if actor
        else None
    )
    return AuditRow(
        record.stream_seq,
        record.run_id,
        event.seq,
        record.event_type,
        event.time.isoformat(),
        who,
        folded.hash,
        event.prev_hash,
        "ok",
        None,
    )


def _rejected_row(record: StoredRecord, finding: Finding) -> AuditRow:
    return AuditRow(
        record.stream_seq,
        record.run_id,
        finding.seq,
        record.event_type,
        None,
        None,
        None,
        None,
        "rejected",
        finding.reason,
    )


class Projector:
    """Keeps one read model caught up with one stream."""

    def __init__(self, store: EventStore, model: ReadModel, stream_id: str) -> None:
        self.store = store
        self.model = model
        self.stream_id = stream_id
        self._states: dict[str, RunState] = {}  # as of stream seq `_states_at`; saves re-reading them
        self._states_at = -1

    async def catch_up(self) -> int:
        """Apply everything up to the stream's current end; returns the number of records applied."""
        if await self.model.meta("stream_id") != self.stream_id:
            log.info("readmodel_rebound", path=str(self.model.path), stream_id=self.stream_id)
            await self.model.reset(self.stream_id)
        applied = 0
        while True:
            start = await self.model.last_seq()
            done = await self._apply_from(start)
            if done is not None:
                return applied + done
            log.debug("readmodel_raced", last_seq=start)  # another process applied first: resume after it

    async def rebuild(self) -> int:
        """Drop every view and replay the stream from sequence 1."""
        await self.model.reset(self.stream_id)
        return await self.catch_up()

    async def _apply_from(self, start: int) -> int | None:
        if self._states_at != start:
            self._states, self._states_at = {}, start
        applied, last = 0, start
        async for records in self.store.read(start + 1):
            batch = await self._fold_batch(records)
            if not await self.model.commit(last, records[-1].stream_seq, batch):
                self._states_at = -1
                return None
            last = records[-1].stream_seq
            for finding in batch.broken.values():  # logged once committed: a refused batch was re-checked
                log.warning("chain_break", finding=finding.describe())
            self._states.update(batch.runs)
            self._states_at = last
            applied += len(records)
        return applied

    async def _fold_batch(self, records: list[StoredRecord]) -> Batch:
        batch = Batch()
        touched = {r.run_id for r in records}
        states: dict[str, RunState | None] = {r: s for r in touched if (s := self._states.get(r)) is not None}
        states.update(await self.model.runs_of(touched - states.keys()))
        walk = ChainWalk(states, await self.model.broken_among(touched))
        for record in records:
            outcome = walk.feed(record)
            if isinstance(outcome, Finding):
                batch.audit.append(_rejected_row(record, outcome))
                continue
            batch.runs[record.run_id] = outcome.state
            batch.audit.append(_accepted_row(record, outcome))
            event = outcome.event
            if isinstance(event, Checkpointed | CorruptSkipped):
                seq = event.checkpoint_seq if isinstance(event, CorruptSkipped) else event.seq
                ref = outcome.state.checkpoint(seq)
                if ref is not None:
                    batch.checkpoints[(record.run_id, seq)] = ref
        batch.broken = walk.findings
        return batch

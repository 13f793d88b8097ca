"""The event-log port's conformance cases: every log passes them (`events.log_port`), the JetStream store in
tests/integration/test_log_conformance.py and the in-process log in tests/unit/test_log_conformance.py.

A tier subclasses `EventLogContract` and gives it a `backend` fixture: writers over one stream, each with its
own key and anchors (as processes over one server), and a way to delete the stream. The cases cover the
compare-and-set on a run's head (racing writers included), reads by sequence and run, and the trust checks
that belong to the log: signatures and the chain verified on read, heads anchored, and a stream that is not
the one anchored refused on open.
"""

import asyncio
from pathlib import Path
from typing import Protocol

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ftrain.domain.chain_walk import ChainWalk, Finding
from ftrain.domain.vouching import Vouched
from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.chain import GENESIS, ChainHead
from ftrain.events.log_port import AppendConflict, EventLog, LogTampered
from ftrain.events.run_id import InvalidRunId
from ftrain.events.signing import Signer, TrustList
from tests.support.builders import checkpointed, launched


class LogBackend(Protocol):
    """What a conformance run needs of one kind of log."""

    def open(
        self,
        *,
        signer: Signer | None = None,
        trust: TrustList | None = None,
        anchors: AnchorFiles | None = None,
    ) -> EventLog:
        """A writer of its own over the stream."""
        ...

    async def delete(self) -> None:
        """Delete the stream, as an operator (or an attacker) could: the next writer to open it creates it."""
        ...


def writer(name: str, tmp_path: Path) -> tuple[Signer, AnchorFiles]:
    """A new signing key, trusted under `name`, and the anchor file it writes in a directory of its own."""
    signer = Signer(Ed25519PrivateKey.generate())
    trust = TrustList({signer.public_key: name})
    return signer, AnchorFiles([tmp_path / name / "anchors.log"], signer, trust)


async def walked(log: EventLog, trust: TrustList | None = None, run_id: str | None = None) -> ChainWalk:
    """Every record read back through the chain walk, as the projector and `audit verify` read them."""
    walk = ChainWalk(trust=trust)
    async for records in log.read(1, run_id=run_id):
        for record in records:
            walk.feed(record)
    return walk


class EventLogContract:
    """The cases every event log passes."""

    @pytest.fixture
    def backend(self) -> LogBackend:
        raise NotImplementedError("a tier's subclass gives the backend")

    @pytest.fixture
    async def store(self, backend: LogBackend) -> EventLog:
        log = backend.open()
        await log.ensure_stream()
        return log

    async def test_append_stamps_and_chains_and_reads_verify(self, store: EventLog) -> None:
        first = await store.append(launched("r1"), ChainHead())
        assert (first.event.seq, first.event.prev_hash, first.stream_seq) == (1, GENESIS, 1)
        assert first.event.actor is not None and first.event.id and first.event.time.year >= 2026
        second = await store.append(checkpointed("r1", 10), first.head)
        assert (second.event.seq, second.event.prev_hash) == (2, first.hash)
        walk = await walked(store)
        state = walk.states["r1"]
        assert not walk.findings and state is not None and state.head == second.head

    async def test_stale_head_is_a_conflict_and_nothing_is_stored(self, store: EventLog) -> None:
        first = await store.append(launched("r1"), ChainHead())
        await store.append(checkpointed("r1", 10), first.head)
        with pytest.raises(AppendConflict):
            await store.append(checkpointed("r1", 20), first.head)
        with pytest.raises(AppendConflict):  # a new run id that already exists
            await store.append(launched("r1"), ChainHead())
        assert await store.last_seq() == 2

    async def test_racing_writers_on_one_run_exactly_one_wins(self, store: EventLog) -> None:
        head = (await store.append(launched("r1"), ChainHead())).head
        results = await asyncio.gather(
            *(store.append(checkpointed("r1", 10 + i), head) for i in range(8)), return_exceptions=True
        )
        winners = [r for r in results if not isinstance(r, BaseException)]
        assert len(winners) == 1
        assert all(isinstance(r, AppendConflict) for r in results if isinstance(r, BaseException))
        assert await store.last_seq() == 2

    async def test_writers_of_their_own_racing_on_a_head_never_fork_the_chain(
        self, backend: LogBackend
    ) -> None:
        logs = [backend.open() for _ in range(4)]
        await asyncio.gather(*(log.ensure_stream() for log in logs))
        head = (await logs[0].append(launched("r1"), ChainHead())).head
        results = await asyncio.gather(
            *(log.append(checkpointed("r1", 10 * (i + 1)), head) for i, log in enumerate(logs)),
            return_exceptions=True,
        )
        landed = [r for r in results if not isinstance(r, BaseException)]
        assert len(landed) == 1 and sum(isinstance(r, AppendConflict) for r in results) == 3
        walk = await walked(logs[1])
        state = walk.states["r1"]
        assert not walk.findings and state is not None and state.head == landed[0].head

    async def test_read_batches_cover_the_stream_and_filter_by_run(self, store: EventLog) -> None:
        heads = {r: (await store.append(launched(r), ChainHead())).head for r in ("a", "b")}
        for step in range(1, 60):
            for run_id in ("a", "b"):
                heads[run_id] = (await store.append(checkpointed(run_id, step), heads[run_id])).head
        batches = [b async for b in store.read(1, batch=25)]
        records = [r for b in batches for r in b]
        assert [r.stream_seq for r in records] == list(range(1, 121))
        assert max(len(b) for b in batches) == 25
        only_b = [r async for b in store.read(1, run_id="b") for r in b]
        assert [r.run_id for r in only_b] == ["b"] * 60
        assert only_b[0].event_type == "launched" and only_b[-1].event_type == "checkpointed"
        assert [r async for b in store.read(121) for r in b] == []
        later = [r.stream_seq async for b in store.read(100, run_id="a") for r in b]
        assert later == list(range(101, 121, 2))

    async def test_an_invalid_run_id_is_never_published(self, store: EventLog) -> None:
        for bad in ("a.b", "*", ">", "", "x" * 129):
            with pytest.raises(InvalidRunId):
                await store.append(launched(bad), ChainHead())
        assert await store.last_seq() == 0

    async def test_the_stream_keeps_its_identity_and_counts_its_records(self, backend: LogBackend) -> None:
        log = backend.open()
        assert await log.facts() is None
        created = await log.ensure_stream()
        assert await backend.open().ensure_stream() == created  # another writer finds the same stream
        await log.append(launched("r1"), ChainHead())
        facts = await log.facts()
        assert facts is not None and (facts.created, facts.last_seq) == (created, 1)
        assert await log.last_seq() == 1

    async def test_signatures_are_checked_on_read_and_a_strangers_events_are_named(
        self, backend: LogBackend, tmp_path: Path
    ) -> None:
        alice, _ = writer("alice", tmp_path)
        mallory, _ = writer("mallory", tmp_path)
        trust = TrustList({alice.public_key: "alice"})
        honest, stranger = backend.open(signer=alice, trust=trust), backend.open(signer=mallory, trust=trust)
        unsigned = backend.open(trust=trust)
        await honest.ensure_stream()
        head = (await honest.append(launched("r1"), ChainHead())).head
        await honest.append(launched("r2"), ChainHead())
        forged = await stranger.append(checkpointed("r1", 10), head)  # well chained, signed by an unknown key
        plain = await unsigned.append(launched("r3"), ChainHead())
        walk = await walked(honest, honest.trust)
        assert not walk.findings and walk.vouched("r2") == Vouched("alice")
        for run_id, appended in (("r1", forged), ("r3", plain)):
            verdict = walk.vouched(run_id)
            assert isinstance(verdict, Finding) and verdict.stream_seq == appended.stream_seq, verdict

    async def test_a_link_after_a_head_that_is_not_the_runs_is_broken_on_read(self, store: EventLog) -> None:
        head = (await store.append(launched("r1"), ChainHead())).head
        forged_head = msgspec.structs.replace(head, hash="f" * 64)  # the stream's position, another chain
        await store.append(checkpointed("r1", 10), forged_head)
        walk = await walked(store)
        outcome = walk.findings["r1"]
        assert (outcome.stream_seq, outcome.seq) == (2, 2) and "prev_hash" in outcome.reason

    async def test_anchored_types_anchor_the_head_and_a_stream_not_the_anchored_one_is_refused(
        self, backend: LogBackend, tmp_path: Path
    ) -> None:
        signer, anchors = writer("alice", tmp_path)
        log = backend.open(signer=signer, trust=anchors.trust, anchors=anchors)
        created = await log.ensure_stream()
        first = await log.append(launched("r1"), ChainHead())  # not an anchored type
        newest = anchors.newest().anchor
        assert newest is not None and (newest.note, newest.created, newest.run_id) == (
            "first seen",
            created,
            None,
        )
        second = await log.append(checkpointed("r1", 10), first.head)
        newest = anchors.newest().anchor
        assert newest is not None
        assert (newest.run_id, newest.seq, newest.head_hash, newest.stream_seq) == (
            "r1",
            2,
            second.hash,
            second.stream_seq,
        )
        await backend.delete()
        with pytest.raises(LogTampered, match="is gone"):
            await backend.open(signer=signer, trust=anchors.trust, anchors=anchors).ensure_stream()
        await backend.open().ensure_stream()  # someone without the anchors creates it anew
        with pytest.raises(LogTampered, match="was re-created"):
            await backend.open(signer=signer, trust=anchors.trust, anchors=anchors).ensure_stream()
        assert anchors.newest().anchor == newest  # refusing wrote nothing

    async def test_an_audit_anchors_the_heads_it_verified(self, backend: LogBackend, tmp_path: Path) -> None:
        signer, anchors = writer("alice", tmp_path)
        log = backend.open(signer=signer, trust=anchors.trust, anchors=anchors)
        await log.ensure_stream()
        head = (await log.append(launched("r1"), ChainHead())).head
        log.anchor_heads({"r1": head}, 1, "sha256:" + "0" * 64)
        newest = anchors.newest().anchor
        assert newest is not None and (newest.root, newest.stream_seq, newest.note) == (
            "sha256:" + "0" * 64,
            1,
            "audit",
        )

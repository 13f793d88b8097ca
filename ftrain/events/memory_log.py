"""An event log held in this process's memory, for tests: what needs only a log (append, fold, decide) runs
without a server. Never a user's default: only tests construct it.

A `MemoryStream` plays the JetStream stream: logs over one stream see the same records, as processes over
one server do, each with its own actor, key and anchors. Records are stored exactly as JetStream stores them
(the sealed payload under its run and type), and an append is a compare-and-set on the run's last stream
sequence under one lock, so of two writers racing on a head (threads or tasks) exactly one lands and the other
gets AppendConflict, as from the stream. Each publish and each batch read yields to the event loop first, as a
round trip to a server does, so tasks racing on a head interleave as they would against the stream.
"""

import asyncio
import threading
from collections.abc import AsyncGenerator

from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.anchors import StreamFacts
from ftrain.events.chain import ChainHead
from ftrain.events.log_port import AppendConflict
from ftrain.events.record import STREAM, StoredRecord
from ftrain.events.schema import Actor, AnyEvent, event_type, now
from ftrain.events.signed_log import SignedLog
from ftrain.events.signing import Signer, TrustList

CONFIG = {"subjects": "ftrain.run.>", "storage": "memory"}
"""The settings an in-process stream reports (nothing is configurable, so nothing can change)."""


class MemoryStream:
    """The records of one stream, shared by the logs that open it; created by the first that ensures it."""

    def __init__(self, name: str = STREAM) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.created: str | None = None
        self.records: list[StoredRecord] = []
        self.heads: dict[str, int] = {}  # run id -> the stream sequence of its last record


class InProcessLog(SignedLog):
    """An event log over a `MemoryStream` (`events.log_port.EventLog`)."""

    def __init__(
        self,
        stream: MemoryStream | None = None,
        *,
        actor: Actor | None = None,
        signer: Signer | None = None,
        anchors: AnchorFiles | None = None,
        trust: TrustList | None = None,
    ) -> None:
        super().__init__(actor=actor, signer=signer, anchors=anchors, trust=trust)
        self.stream = stream or MemoryStream()

    def _facts_now(self) -> StreamFacts | None:
        stream = self.stream
        if stream.created is None:
            return None
        return StreamFacts(stream.name, stream.created, dict(CONFIG), len(stream.records))

    async def facts(self) -> StreamFacts | None:
        """The stream's identity, settings and last sequence (None: not created yet)."""
        with self.stream.lock:
            return self._facts_now()

    async def _create(self) -> StreamFacts:
        with self.stream.lock:
            if self.stream.created is None:
                self.stream.created = now().isoformat()
            facts = self._facts_now()
        assert facts is not None
        return facts

    async def last_seq(self) -> int:
        """The stream's last sequence."""
        with self.stream.lock:
            return len(self.stream.records)

    async def _publish(
        self, event: AnyEvent, payload: bytes, digest: str, head: ChainHead
    ) -> tuple[str, int]:
        stream = self.stream
        await asyncio.sleep(0)
        with stream.lock:
            if stream.heads.get(event.run_id, 0) != head.stream_seq:
                raise AppendConflict(event.run_id, head)
            seq = len(stream.records) + 1
            stream.records.append(StoredRecord(seq, event.run_id, event_type(event), payload))
            stream.heads[event.run_id] = seq
        return digest, seq

    async def read(
        self, from_seq: int = 1, *, run_id: str | None = None, batch: int = 2000
    ) -> AsyncGenerator[list[StoredRecord], None]:
        """Stored records from `from_seq` up to the last sequence at call time (of the stream, or of one
        run), in batches."""
        with self.stream.lock:
            found = [
                r for r in self.stream.records[max(from_seq, 1) - 1 :] if not run_id or r.run_id == run_id
            ]
        for start in range(0, len(found), batch):
            await asyncio.sleep(0)
            yield found[start : start + batch]

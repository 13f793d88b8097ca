"""The event-log port: what everything above the log appends and reads through, whatever holds the stream.

Six calls, as an event-sourcing recorder has: open (check the stream against its anchors), the stream's facts
and last sequence, append after an expected head (a compare-and-set on the run), read from a sequence (one
run's records or all), and anchor heads an audit verified. Implemented over JetStream
(`events.jetstream.store`, what every user runs) and in process (`events.memory_log`, for tests); what both
share of stamping, signing and anchoring is `events.signed_log`, and readers verify what they read with the
chain walk (`domain.chain_walk`), so every check holds whichever log is behind the port.
"""

from collections.abc import AsyncGenerator
from typing import Protocol

import msgspec

from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.anchors import StreamFacts
from ftrain.events.chain import ChainHead
from ftrain.events.record import StoredRecord
from ftrain.events.schema import AnyEvent
from ftrain.events.signing import TrustList


class Appended(msgspec.Struct, frozen=True):
    """An event that the stream acknowledged."""

    event: AnyEvent
    hash: str
    stream_seq: int

    @property
    def head(self) -> ChainHead:
        """The run's head after this event."""
        return ChainHead(self.event.seq, self.hash, self.stream_seq)


class AppendConflict(Exception):
    """Another writer appended to the run first; re-read, re-validate, and retry or give up."""

    def __init__(self, run_id: str, expected: ChainHead) -> None:
        super().__init__(f"run {run_id}: another writer appended after stream seq {expected.stream_seq}")
        self.run_id = run_id


class LogUnavailable(RuntimeError):
    """The event log could not be reached within the deadline."""


class LogTampered(RuntimeError):
    """The stream is not the one anchored (gone, re-created, reconfigured, or shorter): nothing is appended
    until `ftrain server repair` records that the operator accepts it."""


class EventLog(Protocol):
    """The stream of every run's events, as this process writes and reads it."""

    trust: TrustList
    """Whose signatures the readers of this log act on."""
    anchors: AnchorFiles | None
    """Where this process anchors run heads outside the stream (None: nowhere)."""

    async def ensure_stream(self) -> str:
        """Check the stream against the newest anchor (LogTampered when it differs), create it when there is
        neither; returns its creation time, which identifies it to read models."""
        ...

    async def facts(self) -> StreamFacts | None:
        """The stream's identity, retention settings and last sequence (None: no stream)."""
        ...

    async def last_seq(self) -> int:
        """The stream's last sequence."""
        ...

    async def append(self, event: AnyEvent, head: ChainHead) -> Appended:
        """Append `event` as the link after `head`; raises AppendConflict if `head` is no longer the run's
        head (of two writers racing on one head, exactly one lands)."""
        ...

    def read(
        self, from_seq: int = 1, *, run_id: str | None = None, batch: int = 2000
    ) -> AsyncGenerator[list[StoredRecord], None]:
        """Stored records from `from_seq` up to the last sequence at call time (of the stream, or with
        `run_id` of that run's records only), in batches of at most `batch`."""
        ...

    def anchor_heads(self, heads: dict[str, ChainHead], last_seq: int, root: str | None = None) -> None:
        """Anchor run heads (and, from an audit, the root of the first `last_seq` records)."""
        ...

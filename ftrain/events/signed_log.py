"""What every event log does around its stream, whatever holds it: appends stamped, sealed into the run's
chain and signed, the heads of anchored types anchored outside the stream, and the stream checked against
its newest anchor on open (a stream gone, re-created, reconfigured or shorter is LogTampered).

A log implements the stream itself (`_publish` with the compare-and-set on the run's head, `_create`,
`facts`, `last_seq`, `read`); the trust checks stay here, once, so they hold for each (`events.log_port`).
"""

import getpass
import os
import socket
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
import structlog

from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.anchors import Anchor, StreamFacts, stream_change
from ftrain.events.chain import ChainHead, seal
from ftrain.events.log_port import Appended, LogTampered
from ftrain.events.record import StoredRecord
from ftrain.events.run_id import validate_run_id
from ftrain.events.schema import Actor, AnyEvent, encode_event, event_type, now
from ftrain.events.signing import Signer, TrustList

ANCHORED_TYPES = frozenset({"checkpointed", "resumed", "failed", "completed"})
"""Event types whose writer anchors the run's new head outside the stream."""

log = structlog.get_logger(__name__)


def process_actor(rank: int | None = None) -> Actor:
    """The actor stamped on this process's events."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Actor(user=user, host=socket.gethostname(), pid=os.getpid(), rank=rank)


class SignedLog(ABC):
    """An event log whose appends this process stamps, signs and anchors (`events.log_port.EventLog`)."""

    def __init__(
        self,
        *,
        actor: Actor | None = None,
        signer: Signer | None = None,
        anchors: AnchorFiles | None = None,
        trust: TrustList | None = None,
    ) -> None:
        self.actor = actor or process_actor()
        self._sign = signer.sign_hash if signer else None
        self.anchors = anchors
        self.trust = trust or TrustList()
        """Whose signatures the readers of this log act on."""
        self._facts: StreamFacts | None = None  # as ensure_stream found it: what appends anchor

    @abstractmethod
    async def facts(self) -> StreamFacts | None:
        """The stream's identity, retention settings and last sequence (None: no stream)."""

    @abstractmethod
    async def last_seq(self) -> int:
        """The stream's last sequence."""

    @abstractmethod
    def read(
        self, from_seq: int = 1, *, run_id: str | None = None, batch: int = 2000
    ) -> AsyncGenerator[list[StoredRecord], None]:
        """Stored records from `from_seq` (of the stream, or of one run), in batches."""

    @abstractmethod
    async def _create(self) -> StreamFacts:
        """Create the stream (or find the one another process created meanwhile)."""

    @abstractmethod
    async def _publish(
        self, event: AnyEvent, payload: bytes, digest: str, head: ChainHead
    ) -> tuple[str, int]:
        """Store `payload` (`event` sealed, its hash `digest`) under its run if the run's last record is still
        at `head.stream_seq`: the hash and stream sequence stored. Raises AppendConflict otherwise."""

    async def ensure_stream(self) -> str:
        """Check the stream against the newest anchor (raises LogTampered when it differs), create it when
        there is neither; returns its creation time, which identifies it to read models. The anchor is read
        before the stream: another writer may append and anchor in between, and only this order keeps the
        anchored seq at or below the seq the stream shows."""
        newest = self.anchors.newest().anchor if self.anchors else None
        facts = await self.facts()
        if newest is not None and (change := stream_change(newest, facts)) is not None:
            raise LogTampered(
                f"{change}; nothing was appended (`ftrain server repair` accepts it, on record)"
            )
        if facts is None:
            facts = await self._create()
        self._facts = facts
        if newest is None:
            self._anchor_or_warn([Anchor(**self._identity(facts), note="first seen")])
        return facts.created

    async def append(self, event: AnyEvent, head: ChainHead) -> Appended:
        """Append `event` as the link after `head`; raises AppendConflict if `head` is no longer the head."""
        validate_run_id(event.run_id)  # it becomes a subject token: never store an unchecked one
        stamped = msgspec.structs.replace(
            event,
            seq=head.seq + 1,
            prev_hash=head.hash,
            id=event.id or uuid.uuid4().hex,
            time=event.time if event.id else now(),  # a retried event keeps its stamps, so its bytes
            actor=event.actor or self.actor,
        )
        payload, digest = seal(encode_event(stamped), head.hash, self._sign)
        stored, stream_seq = await self._publish(stamped, payload, digest, head)
        appended = Appended(stamped, stored, stream_seq)
        if event_type(stamped) in ANCHORED_TYPES:
            self.anchor_heads({stamped.run_id: appended.head}, stream_seq)
        return appended

    def anchor_heads(self, heads: dict[str, ChainHead], last_seq: int, root: str | None = None) -> None:
        """Anchor run heads (and, from an audit, the root of the first `last_seq` records)."""
        if self.anchors is None or self._facts is None:
            return
        identity = {**self._identity(self._facts), "stream_seq": last_seq}
        notes = [Anchor(**identity, run_id=r, seq=h.seq, head_hash=h.hash) for r, h in sorted(heads.items())]
        self._anchor_or_warn([*notes, Anchor(**identity, root=root, note="audit")] if root else notes)

    def _identity(self, facts: StreamFacts) -> dict[str, Any]:
        return {
            "stream": facts.stream,
            "created": facts.created,
            "config": facts.config,
            "stream_seq": facts.last_seq,
            "time": now(),
        }

    def _anchor_or_warn(self, notes: list[Anchor]) -> None:
        """Append notes that record what already happened: failing to write them (a full disk, the file held
        by a stopped process) weakens detection by one step, so it is logged, never raised."""
        if self.anchors is None:
            return
        try:
            self.anchors.append(notes)
        except OSError as exc:
            log.warning("anchor_not_written", error=f"{type(exc).__name__}: {exc}", notes=len(notes))

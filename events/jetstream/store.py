"""The JetStream event store: append with per-run compare-and-set and deduplication, and bulk reads.

Append is optimistic: the caller passes the run's head it decided on; the server refuses the publish if
another event landed on the run since (`Nats-Expected-Last-Subject-Sequence` over `ftrain.run.<id>.*`), so a
chain never forks. `Nats-Msg-Id` makes a retried publish idempotent within the duplicate window.
"""

import asyncio
import getpass
import os
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import msgspec
import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError

from ftrain.events.anchor_file import AnchorFiles
from ftrain.events.anchors import Anchor, StreamFacts, stream_change
from ftrain.events.chain import ChainHead, seal, unseal
from ftrain.events.jetstream.client import Nats, header_value, is_status
from ftrain.events.record import STREAM, SUBJECT_ROOT, StoredRecord, parse_subject, run_subject
from ftrain.events.run_id import validate_run_id
from ftrain.events.schema import Actor, AnyEvent, decode_event, encode_event, event_type, now
from ftrain.events.signing import Signer, TrustList

ANCHORED_TYPES = frozenset({"checkpointed", "resumed", "failed", "completed"})
"""Event types whose writer anchors the run's new head outside the stream."""
RETENTION_FIELDS = (
    "subjects", "retention", "discard", "storage", "max_msgs", "max_bytes", "max_age",
    "max_msgs_per_subject", "max_msg_size", "deny_delete", "deny_purge", "allow_rollup_hdrs", "sealed",
)  # fmt: skip
"""The stream settings that decide what it keeps: anchored, and checked on every open."""
WRONG_LAST_SEQUENCE = 10071
DUPLICATE_WINDOW_S = 120.0


class NoStreamLeader(Exception):
    """A server answered for a replicated stream that has no leader it can reach (it is in a minority, or the
    replicas are electing): what it reports is its own replica, which may be behind."""


class ReplicaBehind(Exception):
    """The replica that answered a direct get (any replica may) lacks what the leader has acknowledged: it is
    catching up, or cut off from the leader."""


_RETRYABLE = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    ServiceUnavailableError,
    NoStreamLeader,
    ReplicaBehind,
)

log = structlog.get_logger(__name__)
T = TypeVar("T")


class _Backoff:
    """Retry pacing within a deadline: the log may be electing a leader, restarting, or reconnecting."""

    def __init__(self, deadline: float) -> None:
        self._give_up = time.monotonic() + deadline
        self._delay = 0.05

    async def wait(self, what: str, exc: BaseException) -> None:
        """Sleep before the next try, or raise LogUnavailable once the deadline would pass."""
        if time.monotonic() + self._delay > self._give_up:
            raise LogUnavailable(f"event log unreachable ({what}: {type(exc).__name__})") from exc
        log.info("log_retry", what=what, error=type(exc).__name__, delay=self._delay)
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, 1.0)


async def retrying(deadline: float, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, retried on timeouts and unavailability (a leader election, a reconnect) until `deadline`
    (seconds of retrying; then LogUnavailable)."""
    backoff = _Backoff(deadline)
    while True:
        try:
            return await call()
        except _RETRYABLE as exc:
            await backoff.wait(what, exc)


def process_actor(rank: int | None = None) -> Actor:
    """The actor stamped on this process's events."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Actor(user=user, host=socket.gethostname(), pid=os.getpid(), rank=rank)


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


class Repaired(NamedTuple):
    """What `repair` found: what differed from the newest note that counts (None: nothing), the stream as
    accepted, and the anchor lines ignored (no trusted writer vouches for them)."""

    change: str | None
    facts: StreamFacts
    ignored: list[str]


def _facts(info: Any) -> StreamFacts:
    config = info.config
    values = {name: getattr(config, name, None) for name in RETENTION_FIELDS}
    shown = {
        name: ",".join(v) if isinstance(v, list) else str(getattr(v, "value", v))
        for name, v in values.items()
    }
    return StreamFacts(str(config.name), str(info.created), shown, int(info.state.last_seq))


class EventStore:
    """The FTRAIN_EVENTS stream seen through one NATS connection."""

    def __init__(
        self,
        nc: Nats,
        *,
        stream: str = STREAM,
        replicas: int = 1,
        actor: Actor | None = None,
        timeout: float = 2.0,
        deadline: float = 30.0,
        signer: Signer | None = None,
        anchors: AnchorFiles | None = None,
        trust: TrustList | None = None,
    ) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=timeout)
        self.stream = stream
        self.replicas = replicas
        self.actor = actor or process_actor()
        self._timeout = timeout
        self._deadline = deadline
        self._sign = signer.sign_hash if signer else None
        self.anchors = anchors
        self.trust = trust or TrustList()
        """Whose signatures the readers of this store act on."""
        self._facts: StreamFacts | None = None  # as ensure_stream found it: what appends anchor

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        return await retrying(self._deadline, what, call)

    async def _leader_info(self) -> Any:
        """The stream's info as its leader reports it: a member of a leaderless group answers with its own
        replica's state, which may be behind the acknowledged log, so that answer is only "unavailable"."""
        info = await self._js.stream_info(self.stream)
        if info.cluster is not None and info.cluster.leader is None:
            raise NoStreamLeader(f"stream {self.stream} has no leader this server can reach")
        return info

    async def facts(self) -> StreamFacts | None:
        """The stream's identity, retention settings and last sequence, from the leader (None: no stream)."""
        try:
            return _facts(await self._retrying("stream info", self._leader_info))
        except NotFoundError:
            return None

    def config(self) -> StreamConfig:
        """The configuration ftrain creates the stream with (and `repair` restores)."""
        return StreamConfig(
            name=self.stream,
            subjects=[f"{SUBJECT_ROOT}.>"],
            storage=StorageType.FILE,
            num_replicas=self.replicas,
            duplicate_window=DUPLICATE_WINDOW_S,
            deny_delete=True,
            deny_purge=True,
            allow_direct=True,
        )

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

    async def _create(self) -> StreamFacts:
        try:
            info = await self._js.add_stream(self.config())
            log.info("stream_created", stream=self.stream, replicas=self.replicas)
        except BadRequestError:  # created concurrently by another process
            info = await self._js.stream_info(self.stream)
        return _facts(info)

    async def repair(self) -> Repaired:
        """Accept the stream as it is now, on record: re-create it if gone and restore ftrain's retention
        settings if changed, then anchor the result with what was found (against the newest note that
        counts: a line no trusted writer vouches for is ignored, and listed)."""
        newest, ignored = self.anchors.newest() if self.anchors else (None, [])
        facts = await self.facts()  # after the anchor, as in ensure_stream
        change = stream_change(newest, facts) if newest is not None else None
        if facts is None:
            facts = await self._create()
        elif newest is not None and facts.config != newest.config:
            await self._js.update_stream(self.config())
            facts = await self.facts() or facts
        self._facts = facts
        if self.anchors is not None:  # an operator's decision: not writing it is an error, never a warning
            self.anchors.append(
                [Anchor(**self._identity(facts), note=f"repair: {change or 'nothing differed'}")]
            )
        return Repaired(change, facts, ignored)

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

    def anchor_heads(self, heads: dict[str, ChainHead], last_seq: int, root: str | None = None) -> None:
        """Anchor run heads (and, from an audit, the root of the first `last_seq` records)."""
        if self.anchors is None or self._facts is None:
            return
        identity = {**self._identity(self._facts), "stream_seq": last_seq}
        notes = [Anchor(**identity, run_id=r, seq=h.seq, head_hash=h.hash) for r, h in sorted(heads.items())]
        self._anchor_or_warn([*notes, Anchor(**identity, root=root, note="audit")] if root else notes)

    async def last_seq(self) -> int:
        """The stream's last sequence, from the leader."""
        return int((await self._retrying("stream info", self._leader_info)).state.last_seq)

    async def head(self, run_id: str) -> tuple[ChainHead, str | None] | None:
        """The run's last stored event as a chain head and its Nats-Msg-Id, read from the stream leader."""
        try:
            msg = await self._retrying(
                f"head of {run_id}", lambda: self._js.get_last_msg(self.stream, run_subject(run_id))
            )
        except NotFoundError:
            return None
        parts = unseal(msg.data or b"")
        try:
            seq = decode_event(parts[0]).seq if parts else 0
        except (msgspec.DecodeError, msgspec.ValidationError):  # a forgery: the chain check reports it
            seq = 0
        msg_id = (msg.headers or {}).get("Nats-Msg-Id")
        return ChainHead(seq, parts[1] if parts else "", int(msg.seq or 0)), msg_id

    async def append(self, event: AnyEvent, head: ChainHead) -> Appended:
        """Append `event` as the link after `head`; raises AppendConflict if `head` is no longer the head."""
        validate_run_id(event.run_id)  # it becomes a subject token: never publish an unchecked one
        stamped = msgspec.structs.replace(
            event,
            seq=head.seq + 1,
            prev_hash=head.hash,
            id=event.id or uuid.uuid4().hex,
            time=event.time if event.id else now(),  # a retried event keeps its stamps, so its bytes
            actor=event.actor or self.actor,
        )
        payload, digest = seal(encode_event(stamped), head.hash, self._sign)
        headers = {
            "Nats-Msg-Id": stamped.id,
            "Nats-Expected-Last-Subject-Sequence": str(head.stream_seq),
            "Nats-Expected-Last-Subject-Sequence-Subject": run_subject(stamped.run_id),
        }
        subject = run_subject(stamped.run_id, event_type(stamped))
        backoff = _Backoff(self._deadline)
        while True:
            try:
                ack = await asyncio.wait_for(
                    self._js.publish(subject, payload, timeout=self._timeout, headers=headers),
                    self._timeout + 1.0,
                )
                return self._landed(stamped, digest, int(ack.seq))
            except BadRequestError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise
                found = await self.head(stamped.run_id)
                if found is not None and found[1] == stamped.id:  # an earlier try of ours landed
                    return self._landed(stamped, found[0].hash, found[0].stream_seq)
                raise AppendConflict(stamped.run_id, head) from exc
            except _RETRYABLE as exc:
                await backoff.wait(f"append to {stamped.run_id}", exc)

    def _landed(self, event: AnyEvent, digest: str, stream_seq: int) -> Appended:
        """The acknowledged event; its run's new head is anchored when its type is one that is."""
        appended = Appended(event, digest, stream_seq)
        if event_type(event) in ANCHORED_TYPES:
            self.anchor_heads({event.run_id: appended.head}, stream_seq)
        return appended

    async def read(
        self, from_seq: int = 1, *, run_id: str | None = None, batch: int = 2000
    ) -> AsyncGenerator[list[StoredRecord], None]:
        """Stored records from `from_seq` up to the last sequence the leader reports at call time (of the
        stream, or with `run_id` of that run's events, and only those), in batches.

        Uses batched direct gets: one request returns up to `batch` messages, several times faster than a
        consumer in nats-py. Any replica may answer one, the nearest first, and a replica may be behind the
        leader: a batch that ends short of the leader's last sequence is asked again until one reaches it
        (or, past the deadline, the log is unavailable), so a read never returns less than was acknowledged.
        """
        if run_id:
            found = await self.head(run_id)
            last, subject = (found[0].stream_seq if found else 0), run_subject(run_id)
        else:
            last, subject = await self.last_seq(), None
        if from_seq > last:
            return
        pending = asyncio.ensure_future(self._read_batch(from_seq, batch, subject, last))
        try:
            while True:
                records = await pending
                seq = records[-1].stream_seq + 1
                if seq <= last:  # fetch the next batch while the caller works on this one
                    pending = asyncio.ensure_future(self._read_batch(seq, batch, subject, last))
                yield records
                if seq > last:
                    return
        finally:
            pending.cancel()

    async def _read_batch(self, seq: int, batch: int, subject: str | None, last: int) -> list[StoredRecord]:
        """The next batch from `seq`, which the leader says holds records up to `last`."""

        async def fetch() -> list[StoredRecord]:
            if records := await self._direct_batch(seq, batch, subject):
                return records
            raise ReplicaBehind(
                f"the replica that answered has nothing from seq {seq}; the leader has {last}"
            )

        return await self._retrying(f"read from seq {seq}", fetch)

    async def _direct_batch(self, seq: int, batch: int, subject: str | None) -> list[StoredRecord]:
        records: list[StoredRecord] = []
        done = asyncio.get_running_loop().create_future()

        def on_msg(headers: bytes | None, data: bytes) -> None:
            if headers is None or is_status(headers):  # 204 end of batch, 404 nothing (more) to read
                if not done.done():
                    done.set_result(None)
                return
            stream_seq = header_value(headers, b"Nats-Sequence")
            run_id, event_type = parse_subject((header_value(headers, b"Nats-Subject") or b"").decode())
            records.append(StoredRecord(int(stream_seq or 0), run_id, event_type, data))

        request: dict[str, Any] = {"seq": seq, "batch": batch}
        if subject:
            request["next_by_subj"] = subject
        inbox = self._nc.new_inbox()
        sub = await self._nc.raw_subscribe(inbox, on_msg)
        try:
            await self._nc.publish(
                f"$JS.API.DIRECT.GET.{self.stream}", msgspec.json.encode(request), reply=inbox
            )
            await asyncio.wait_for(done, self._timeout * 5)
        finally:
            await self._nc.raw_unsubscribe(sub)
        return records

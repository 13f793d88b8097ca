"""The JetStream event store, the event log every user runs (`events.log_port`): append with per-run
compare-and-set and deduplication, and bulk reads.

Append is optimistic: the caller passes the run's head it decided on; the server refuses the publish if
another event landed on the run since (`Nats-Expected-Last-Subject-Sequence` over `ftrain.run.<id>.*`), so a
chain never forks. `Nats-Msg-Id` makes a retried publish idempotent within the duplicate window.
"""

import asyncio
import time
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
from ftrain.events.chain import ChainHead, unseal
from ftrain.events.jetstream.nats_client import Nats, header_value, is_status
from ftrain.events.log_port import AppendConflict, LogUnavailable
from ftrain.events.record import STREAM, SUBJECT_ROOT, StoredRecord, parse_subject, run_subject
from ftrain.events.schema import Actor, AnyEvent, decode_event, event_type
from ftrain.events.signed_log import SignedLog
from ftrain.events.signing import Signer, TrustList

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


class EventStore(SignedLog):
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
        super().__init__(actor=actor, signer=signer, anchors=anchors, trust=trust)
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=timeout)
        self.stream = stream
        self.replicas = replicas
        self._timeout = timeout
        self._deadline = deadline

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

    async def _publish(
        self, event: AnyEvent, payload: bytes, digest: str, head: ChainHead
    ) -> tuple[str, int]:
        """Publish with the run's expected last sequence and the event id as Nats-Msg-Id, retried within the
        deadline: a retry of a publish that landed is deduplicated, or refused (10071) with our own event at
        the head, which counts as landed."""
        headers = {
            "Nats-Msg-Id": event.id,
            "Nats-Expected-Last-Subject-Sequence": str(head.stream_seq),
            "Nats-Expected-Last-Subject-Sequence-Subject": run_subject(event.run_id),
        }
        subject = run_subject(event.run_id, event_type(event))
        backoff = _Backoff(self._deadline)
        while True:
            try:
                ack = await asyncio.wait_for(
                    self._js.publish(subject, payload, timeout=self._timeout, headers=headers),
                    self._timeout + 1.0,
                )
                return digest, int(ack.seq)
            except BadRequestError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise
                found = await self.head(event.run_id)
                if found is not None and found[1] == event.id:  # an earlier try of ours landed
                    return found[0].hash, found[0].stream_seq
                raise AppendConflict(event.run_id, head) from exc
            except _RETRYABLE as exc:
                await backoff.wait(f"append to {event.run_id}", exc)

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

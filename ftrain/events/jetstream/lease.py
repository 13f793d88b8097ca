"""The supervisor lease: which process supervises a run, held in a JetStream KV bucket and renewed.

Two keys per run in the bucket `ftrain_leases` (stream `KV_ftrain_leases`):

- `<run>.live`, the lease itself, whose value names its holder. Every write of it carries a per-message TTL
  (`Nats-TTL`), so the server removes it once its holder stops renewing: present means live, by the server's
  clock alone, never by comparing two machines' clocks (nats-server 2.15.1, measured: a key written with a
  1, 2 or 5 s TTL is gone within 11 ms of it; TTLs are whole seconds, at least 1). Taking and renewing are
  compare-and-set on the key's last sequence (`Nats-Expected-Last-Subject-Sequence`): of two supervisors taking
  an expired lease one wins, and a holder whose lease another took learns it at its next renewal.
- `<run>.holder`, the last holder, kept without TTL, written by each holder right after it took the lease: whom
  a relaunch names when it finds the lease expired, and how it knows the run ever had a leased supervisor.

Unavailable is never expired: every read goes to the stream's leader (not a direct get a replica may answer),
and a read that fails raises LogUnavailable. Nothing here is signed: whoever holds the writer's credential is
trusted with the log anyway; the read-only credential may read the bucket, never write it (`server_files`).
"""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Final, NamedTuple, TypeVar

import msgspec
import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BadRequestError, NotFoundError

from ftrain.events.jetstream.connection import (
    PERMISSION_DENIED,
    NatsSettings,
    PermissionDenied,
    server_endpoint,
)
from ftrain.events.jetstream.nats_client import Nats
from ftrain.events.jetstream.store import WRONG_LAST_SEQUENCE, retrying
from ftrain.events.lease_record import BUCKET, LEASE_STREAM, MAX_TTL, Holder
from ftrain.events.log_port import LogUnavailable
from ftrain.events.redact import redact_urls
from ftrain.events.run_id import validate_run_id

EXPIRY_MARGIN: Final = 2.0
"""How long past its TTL a relaunch waits for an unrenewed lease before calling it live after all."""
WAIT_POLL: Final = 0.25
_DELETE = {"KV-Operation": "DEL"}

log = structlog.get_logger(__name__)
T = TypeVar("T")


class LeaseView(NamedTuple):
    """A run's lease as read from the leader: live or not, its holder (while live: the live key's, else the
    last on record; None: no supervisor ever leased the run, or a value that does not decode), and the live
    key's last sequence, which a take must name."""

    live: bool
    holder: Holder | None
    revision: int


class LeaseTaken(Exception):
    """Another supervisor holds the lease (it took it first, or took it over from this one)."""


_decoder = msgspec.json.Decoder(Holder)


def _subject(run_id: str, key: str) -> str:
    return f"$KV.{BUCKET}.{validate_run_id(run_id)}.{key}"


def _holder(data: bytes | None) -> Holder | None:
    try:
        return _decoder.decode(data or b"")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class LeaseStore:
    """The lease bucket seen through one NATS connection."""

    def __init__(self, js: JetStreamContext, *, replicas: int = 1, deadline: float = 30.0) -> None:
        self._js = js
        self.replicas = replicas
        self._deadline = deadline

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        return await retrying(self._deadline, what, call)

    async def _last(self, subject: str) -> tuple[int, bytes | None]:
        """The key's last sequence and value, from the stream's leader: (0, None) when nothing is stored
        (never written, expired, or no bucket yet); a delete marker is its sequence and no value."""
        try:
            msg = await self._retrying(
                f"lease {subject}", lambda: self._js.get_last_msg(LEASE_STREAM, subject)
            )
        except NotFoundError:
            return 0, None
        deleted = (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE")
        return int(msg.seq or 0), None if deleted else (msg.data or b"")

    async def read(self, run_id: str) -> LeaseView:
        """The run's lease now. Raises LogUnavailable (never taken for an expired lease)."""
        revision, value = await self._last(_subject(run_id, "live"))
        if value is not None:
            return LeaseView(True, _holder(value), revision)
        _, last = await self._last(_subject(run_id, "holder"))
        return LeaseView(False, _holder(last), revision)

    async def until_expired(self, run_id: str, view: LeaseView) -> tuple[bool, LeaseView]:
        """Watch a live lease, at most its TTL and a margin: True once the server expired it (nothing is
        stored under it any more), False as soon as its holder shows it is alive (it renewed or released
        it: the revision moved) or when the wait ran out; with the lease as last read."""
        ttl = view.holder.ttl if view.holder else MAX_TTL
        give_up = time.monotonic() + ttl + EXPIRY_MARGIN
        while time.monotonic() < give_up:
            await asyncio.sleep(WAIT_POLL)
            seen = await self.read(run_id)
            if seen.revision == 0 and not seen.live:
                return True, seen
            if seen.revision != view.revision:
                return False, seen
        return False, view

    async def ensure_bucket(self) -> None:
        """Create the bucket unless it exists: history 1, file storage, per-message TTLs allowed."""
        try:
            await self._retrying("lease bucket", lambda: self._js.stream_info(LEASE_STREAM))
        except NotFoundError:
            config = KeyValueConfig(
                bucket=BUCKET, history=1, storage=StorageType.FILE, replicas=self.replicas
            )
            with suppress(BadRequestError):  # created concurrently
                await self._js.create_key_value(config)

    async def take(self, run_id: str, holder: Holder, revision: int) -> int:
        """Take the lease, expecting the live key at `revision` (what a read found: 0, a delete marker, or
        an expired holder's), and record the holder; returns the lease's revision. Raises LeaseTaken when
        another supervisor got there first."""
        await self.ensure_bucket()
        taken = await self._put(run_id, holder, revision)
        await self.note(run_id, holder)
        return taken

    async def note(self, run_id: str, holder: Holder) -> None:
        """Record `holder` as the run's last (after a take, and when it opens another attempt)."""
        payload = msgspec.json.encode(holder)
        await self._retrying("lease holder", lambda: self._js.publish(_subject(run_id, "holder"), payload))

    async def renew(self, run_id: str, holder: Holder, revision: int) -> int:
        """Renew the lease held at `revision`; returns the new revision. A lease that expired meanwhile (the
        log was out of reach for a TTL) is taken back unless another supervisor held it since; raises
        LeaseTaken when one did."""
        try:
            return await self._put(run_id, holder, revision)
        except LeaseTaken:
            seen = await self.read(run_id)
            if seen.live or seen.holder is None or not _same(seen.holder, holder):
                raise
            log.warning("lease_taken_back", run_id=run_id, holder=holder.describe())
            return await self._put(run_id, holder, seen.revision)

    async def release(self, run_id: str, revision: int) -> None:
        """End a lease held at `revision` (a delete marker, compare-and-set: never a successor's)."""
        headers = {**_DELETE, "Nats-Expected-Last-Subject-Sequence": str(revision)}
        with suppress(BadRequestError):
            await self._retrying(
                "lease release", lambda: self._js.publish(_subject(run_id, "live"), headers=headers)
            )

    async def _put(self, run_id: str, holder: Holder, revision: int) -> int:
        """Write the live key with the holder's TTL if it is still at `revision`; a try that timed out but
        landed is recognised by its bytes."""
        subject = _subject(run_id, "live")
        payload = msgspec.json.encode(holder)
        headers = {"Nats-Expected-Last-Subject-Sequence": str(revision)}
        try:
            ack = await self._retrying(
                f"lease {run_id}",
                lambda: self._js.publish(subject, payload, headers=headers, msg_ttl=holder.ttl),
            )
        except BadRequestError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            landed, value = await self._last(subject)
            if value == payload:
                return landed
            raise LeaseTaken(f"run {run_id}'s lease is held by another supervisor") from exc
        return int(ack.seq)


def _same(a: Holder, b: Holder) -> bool:
    """The same supervisor process (whatever attempt it is in now)."""
    return (a.user, a.host, a.pid, a.taken) == (b.user, b.host, b.pid, b.taken)


@asynccontextmanager
async def open_leases(settings: NatsSettings, *, deadline: float = 30.0) -> AsyncIterator[LeaseStore]:
    """A LeaseStore on its own connection to the log's servers (the embedded one started if needed); raises
    LogUnavailable when none answers."""
    urls, options = server_endpoint(settings)

    async def quiet(exc: Exception) -> None:
        """Without an error callback nats-py prints a traceback; a refused request (a key that may not
        read the bucket) ends at once instead of waiting out its deadline."""
        log.debug("nats_error", error=type(exc).__name__)
        if PERMISSION_DENIED in str(exc):
            nc.fail_requests(PermissionDenied(f"refused by the server: {str(exc).removeprefix('nats: ')}"))

    nc = Nats()
    try:
        await asyncio.wait_for(
            nc.connect(servers=urls, connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=1,
                       ping_interval=2, max_outstanding_pings=2, error_cb=quiet, **options),
            5.0,
        )  # fmt: skip
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        with suppress(Exception):
            await nc.close()
        raise LogUnavailable(f"event log unreachable at {redact_urls(urls)}: {type(exc).__name__}") from exc
    try:
        yield LeaseStore(nc.jetstream(timeout=2.0), replicas=settings.replicas, deadline=deadline)
    finally:
        with suppress(OSError, nats.errors.Error):
            await nc.close()

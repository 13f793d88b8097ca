"""Keeping the supervisor's lease (`events.jetstream.lease`) while `ftrain run` supervises: renewed from a
thread of its own, on a connection of its own, three times per TTL, so the supervisor's loop never waits on
the log for it. A renewal that finds another supervisor holding the lease marks it lost: the supervisor then
stops its attempt rather than fight for the run. A log out of reach is no loss: renewing goes on, and a lease
that expired meanwhile is taken back unless another supervisor took it first.
"""

import asyncio
import threading
import time

import msgspec
import structlog

from ftrain.events.jetstream.connection import NatsSettings
from ftrain.events.jetstream.lease import LeaseStore, LeaseTaken, open_leases
from ftrain.events.lease_record import Holder
from ftrain.events.log_port import LogUnavailable
from ftrain.events.schema import now
from ftrain.events.signed_log import process_actor

log = structlog.get_logger(__name__)


def this_supervisor(ttl: int, attempt: int = 0) -> Holder:
    """This process as a lease holder: user, host, pid, with a lease of `ttl` seconds taken now."""
    actor, moment = process_actor(), now()
    return Holder(
        user=actor.user,
        host=actor.host,
        pid=actor.pid,
        attempt=attempt,
        ttl=ttl,
        taken=moment,
        renewed=moment,
    )


class LeaseKeeper:
    """Renews `holder`'s lease on `run_id`, taken at `revision`, until closed; `lost` then says why not."""

    def __init__(self, run_id: str, settings: NatsSettings, holder: Holder, revision: int) -> None:
        self.run_id = run_id
        self.attempt = holder.attempt
        """The attempt the supervisor is in now: each renewal names it."""
        self.lost: str | None = None
        """Set once another supervisor holds the lease: the one line saying who."""
        self._settings = settings
        self._holder = holder
        self._revision = revision
        self._release = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{run_id}", daemon=True)

    def start(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def close(self, *, release: bool) -> None:
        """Stop renewing; with `release`, end the lease (a supervisor that is done), else let it expire."""
        self._release = release
        self._stop.set()
        self._thread.join(timeout=self._holder.ttl)

    def _run(self) -> None:
        asyncio.run(self._keep())

    async def _keep(self) -> None:
        period = self._holder.ttl / 3
        while not self._stop.is_set() and self.lost is None:
            try:
                async with open_leases(self._settings, deadline=period) as leases:
                    await self._renewing(leases, period)
                    if self._release and self.lost is None:
                        await leases.release(self.run_id, self._revision)
                    return
            except LogUnavailable as exc:  # renewing goes on; nothing is decided from it here
                log.warning("lease_not_renewed", run_id=self.run_id, error=str(exc))
                await self._pause(period)

    async def _renewing(self, leases: LeaseStore, period: float) -> None:
        """Renew every `period` until stopped or lost; a renewal that cannot reach the log is retried."""
        due = time.monotonic() + period
        while not self._stop.is_set():
            await self._pause(due - time.monotonic())
            if self._stop.is_set():
                return
            due = time.monotonic() + period
            holder = msgspec.structs.replace(self._holder, attempt=self.attempt, renewed=now())
            try:
                self._revision = await leases.renew(self.run_id, holder, self._revision)
                if holder.attempt != self._holder.attempt:  # a relaunch: a take-over names the attempt
                    await leases.note(self.run_id, holder)
                    self._holder = holder
            except LeaseTaken:
                taker = (await leases.read(self.run_id)).holder
                self.lost = (
                    f"run {self.run_id}'s lease was taken over"
                    + (f" by {taker.describe()}" if taker else "")
                    + f"; attempt {self.attempt} stopped"
                )
                log.warning("lease_lost", run_id=self.run_id, message=self.lost)
                return
            except LogUnavailable as exc:
                log.warning("lease_not_renewed", run_id=self.run_id, error=str(exc))

    async def _pause(self, seconds: float) -> None:
        """Sleep, cut short by close()."""
        await asyncio.to_thread(self._stop.wait, max(seconds, 0.0))

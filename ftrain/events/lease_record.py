"""The supervisor lease's record: who holds a run's lease and for how long (`events.jetstream.lease` keeps
it in NATS). Pure: the command line reads the TTL's bounds from here without loading a NATS client."""

from datetime import datetime
from typing import Annotated, Final

import msgspec

from ftrain.events.schema import Count, now

BUCKET: Final = "ftrain_leases"
"""The JetStream KV bucket of the leases, one key pair per run (`events.jetstream.lease`)."""
LEASE_STREAM: Final = f"KV_{BUCKET}"
MIN_TTL: Final = 3
"""Seconds: the server's per-message TTL is whole seconds, and a holder renews three times per TTL."""
MAX_TTL: Final = 3600
DEFAULT_TTL: Final = 30

Ttl = Annotated[int, msgspec.Meta(ge=MIN_TTL, le=MAX_TTL)]
Name = Annotated[str, msgspec.Meta(max_length=256)]


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """A supervisor holding a run's lease: who and where, the attempt it supervises, its TTL, since when."""

    user: Name
    host: Name
    pid: Count
    attempt: Count
    ttl: Ttl
    taken: datetime
    renewed: datetime

    def describe(self) -> str:
        """`alice@node7 pid 4242 (attempt 2)`."""
        return f"{self.user}@{self.host} pid {self.pid} (attempt {self.attempt})"


def held_for(holder: Holder | None, moment: datetime | None = None) -> str:
    """`alice@node7 pid 4242 (attempt 2), renewed 3 s ago (TTL 30 s)`, by the holder's own clock."""
    if holder is None:
        return "a holder whose record does not read"
    age = ((moment or now()) - holder.renewed).total_seconds()
    return f"{holder.describe()}, renewed {max(age, 0.0):.0f} s ago (TTL {holder.ttl} s)"

"""One stored record's verdict for a follower: the chain walk's, and its own signature's.

An audit checks one signature per run (the newest vouches for the rest); a follower of the stream wants each
event's on its own, as it lands, including a forgery's, which the chain walk refuses without looking at who
signed it.
"""

import msgspec

from ftrain.domain.chain_walk import ChainWalk, Finding
from ftrain.events.chain import unseal
from ftrain.events.record import StoredRecord
from ftrain.events.schema import AnyEvent, decode_event
from ftrain.events.signing import EVENT_DOMAIN, Signature, TrustList, signature_valid


class SignatureVerdict(msgspec.Struct, frozen=True):
    """Who signed (public key hex, or None: unsigned), the trusted writer's name, and the verdict in words:
    "signed by alice@host", "unsigned", "signed by untrusted key …", "bad signature"."""

    signer: str | None
    name: str | None
    verdict: str


class EventVerdict(msgspec.Struct, frozen=True):
    """A record as a follower reports it: the event when it decodes, its claimed hash, and both verdicts
    (`chain`: "ok" or what the chain walk found)."""

    stream_seq: int
    run_id: str
    event_type: str
    event: AnyEvent | None
    hash: str | None
    chain: str
    signature: SignatureVerdict

    @property
    def ok(self) -> bool:
        """Whether the chain walk accepted the record."""
        return self.chain == "ok"


def signature_verdict(signature: Signature | None, chain_hash: str, trust: TrustList) -> SignatureVerdict:
    """Check one event's signature over its hash, and name its signer by `trust`."""
    if signature is None:
        return SignatureVerdict(None, None, "unsigned")
    if not signature_valid(signature, EVENT_DOMAIN, chain_hash.encode("ascii", "replace")):
        return SignatureVerdict(signature.signer, None, "bad signature")
    name = trust.name(signature.signer)
    return SignatureVerdict(signature.signer, name, f"signed by {name or trust.describe(signature.signer)}")


class Judged(msgspec.Struct, frozen=True):
    """A record as the chain walk judged it, its signature not checked yet (`signed` checks it): a view of a
    long run checks only the signatures it shows."""

    record: StoredRecord
    event: AnyEvent | None
    hash: str | None
    chain: str

    @property
    def ok(self) -> bool:
        """Whether the chain walk accepted the record."""
        return self.chain == "ok"

    @property
    def stream_seq(self) -> int:
        return self.record.stream_seq

    @property
    def event_type(self) -> str:
        return self.record.event_type


def judged(walk: ChainWalk, record: StoredRecord) -> Judged:
    """Feed `record` to `walk`; a refused record's event is still decoded when it can be, so a follower shows
    what the forgery claims."""
    outcome = walk.feed(record)
    if isinstance(outcome, Finding):
        parts = unseal(record.payload)
        event = _decoded(parts.body) if parts else None
        return Judged(record, event, parts.hash if parts else None, outcome.reason)
    return Judged(record, outcome.event, outcome.hash, "ok")


def signed(judged: Judged, trust: TrustList) -> EventVerdict:
    """The record's verdict with its own signature checked against `trust`."""
    record = judged.record
    parts = unseal(record.payload)
    claimed = parts.hash if parts else None
    signature = signature_verdict(parts.signature if parts else None, claimed or "", trust)
    return EventVerdict(
        record.stream_seq,
        record.run_id,
        record.event_type,
        judged.event,
        judged.hash,
        judged.chain,
        signature,
    )


def event_verdict(walk: ChainWalk, record: StoredRecord, trust: TrustList) -> EventVerdict:
    """Feed `record` to `walk` and check its signature (`judged`, then `signed`)."""
    return signed(judged(walk, record), trust)


def _decoded(body: bytes) -> AnyEvent | None:
    try:
        return decode_event(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None

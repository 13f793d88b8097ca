"""The per-run hash chain, pure: sealing an event's bytes and checking one link.

A stored payload is the event's canonical JSON with one member appended, `"hash"`, where

    hash = SHA-256(prev_hash as ASCII hex ‖ the payload without that trailing `,"hash":"…"` member)

so a reader verifies the exact bytes stored, never a re-encoding; decoders ignore the extra member.
"""

import hashlib

import msgspec

from events.schema import AnyEvent, decode_event, event_type

GENESIS = "0" * 64
_PREFIX = b',"hash":"'
_SUFFIX = b'"}'
_SEAL_LEN = len(_PREFIX) + 64 + len(_SUFFIX)


class ChainHead(msgspec.Struct, frozen=True):
    """The last accepted event of a run: its per-run seq, hash, and stream sequence (0 for a new run)."""

    seq: int = 0
    hash: str = GENESIS
    stream_seq: int = 0


class Linked(msgspec.Struct, frozen=True):
    """A payload that extends the chain correctly."""

    event: AnyEvent
    hash: str


class Broken(msgspec.Struct, frozen=True):
    """A payload that does not extend the chain; `reason` says what broke."""

    reason: str
    seq: int | None = None
    event_type: str | None = None


def link_hash(prev_hash: str, body: bytes) -> str:
    """SHA-256 over the previous hash and the event's canonical bytes."""
    digest = hashlib.sha256(prev_hash.encode("ascii"))
    digest.update(body)
    return digest.hexdigest()


def seal(body: bytes, prev_hash: str) -> tuple[bytes, str]:
    """The payload to store for canonical `body`, and its hash."""
    digest = link_hash(prev_hash, body)
    return body[:-1] + _PREFIX + digest.encode("ascii") + _SUFFIX, digest


def unseal(payload: bytes) -> tuple[bytes, str] | None:
    """Split a stored payload into the hashed body and the claimed hash; None when not sealed."""
    if len(payload) <= _SEAL_LEN or not payload.endswith(_SUFFIX):
        return None
    cut = len(payload) - _SEAL_LEN
    if payload[cut : cut + len(_PREFIX)] != _PREFIX:
        return None
    claimed = payload[cut + len(_PREFIX) : -len(_SUFFIX)].decode("ascii", "replace")
    return payload[:cut] + b"}", claimed


def check_link(head: ChainHead, run_id: str, subject_type: str, payload: bytes) -> Linked | Broken:
    """Whether `payload`, stored under `ftrain.run.<run_id>.<subject_type>`, is the next link after `head`."""
    parts = unseal(payload)
    if parts is None:
        return Broken("payload carries no hash")
    body, claimed = parts
    try:
        event = decode_event(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Broken(f"undecodable payload ({exc})")
    seq, etype = event.seq, event_type(event)
    if event.run_id != run_id or etype != subject_type:
        return Broken(
            f"stored under run {run_id!r} type {subject_type!r} but says {event.run_id!r} {etype!r}", seq
        )
    if link_hash(event.prev_hash, body) != claimed:
        return Broken("hash mismatch: the payload was altered", seq, str(etype))
    if seq != head.seq + 1:
        return Broken(f"sequence gap: expected seq {head.seq + 1}, found {seq}", seq, str(etype))
    if event.prev_hash != head.hash:
        return Broken(
            f"prev_hash {event.prev_hash[:12]}… does not match the hash of seq {head.seq}", seq, str(etype)
        )
    return Linked(event, claimed)

"""The per-run hash chain, pure: sealing an event's bytes and checking one link.

A stored payload is the event's canonical JSON with trailing members appended: `"hash"`, where

    hash = SHA-256(prev_hash as ASCII hex ‖ the payload without its trailing members)

and, when its writer signed it, `"signer"` (the Ed25519 public key, hex) and `"sig"` (the signature over
`ftrain-event-v1:` ‖ hash, hex; see `events.signing`). So a reader verifies the exact bytes stored, never a
re-encoding; decoders ignore the extra members. Payloads from before signing end after `"hash"` and still
read, as unsigned.
"""

import hashlib
import re
from collections.abc import Callable
from typing import NamedTuple

import msgspec

from ftrain.events.schema import AnyEvent, decode_event, event_type
from ftrain.events.signing import Signature

SignHash = Callable[[str], Signature]

GENESIS = "0" * 64
_PREFIX = b',"hash":"'
_SUFFIX = b'"}'
_SEAL_LEN = len(_PREFIX) + 64 + len(_SUFFIX)
_SIGNER = b'","signer":"'
_SIG = b'","sig":"'
_SIGNED_LEN = len(_PREFIX) + 64 + len(_SIGNER) + 64 + len(_SIG) + 128 + len(_SUFFIX)
_DIGEST = re.compile(r"[0-9a-f]{64}")


class ChainHead(msgspec.Struct, frozen=True, gc=False):
    """The last accepted event of a run: its per-run seq, hash, and stream sequence (0 for a new run)."""

    seq: int = 0
    hash: str = GENESIS
    stream_seq: int = 0


class Linked(msgspec.Struct, frozen=True):
    """A payload that extends the chain correctly."""

    event: AnyEvent
    hash: str
    signature: Signature | None = None


class Broken(msgspec.Struct, frozen=True):
    """A payload that does not extend the chain; `reason` says what broke."""

    reason: str
    seq: int | None = None
    event_type: str | None = None


def is_digest(value: str) -> bool:
    """Whether `value` has a chain hash's form, 64 lowercase hex digits: a `prev_hash` of any other form is
    refused before it is hashed (a non-ASCII one cannot even be encoded)."""
    return _DIGEST.fullmatch(value) is not None


def link_hash(prev_hash: str, body: bytes) -> str:
    """SHA-256 over the previous hash and the event's canonical bytes."""
    digest = hashlib.sha256(prev_hash.encode("ascii"))
    digest.update(body)
    return digest.hexdigest()


def seal(body: bytes, prev_hash: str, sign: SignHash | None = None) -> tuple[bytes, str]:
    """The payload to store for canonical `body`, and its hash, signed by `sign` when given."""
    digest = link_hash(prev_hash, body)
    return body[:-1] + _trailer(digest, sign(digest) if sign else None), digest


def _trailer(digest: str, signature: Signature | None) -> bytes:
    hashed = _PREFIX + digest.encode("ascii")
    if signature is None:
        return hashed + _SUFFIX
    return hashed + _SIGNER + signature.signer.encode() + _SIG + signature.sig.encode() + _SUFFIX


class Sealed(NamedTuple):
    """A stored payload taken apart: the hashed body, the claimed hash, and the signature if any."""

    body: bytes
    hash: str
    signature: Signature | None


def unseal(payload: bytes) -> Sealed | None:
    """Split a stored payload into body, claimed hash and signature; None when it carries no hash."""
    if not payload.endswith(_SUFFIX):
        return None
    cut = len(payload) - _SIGNED_LEN
    if cut > 0 and payload[cut : cut + len(_PREFIX)] == _PREFIX:
        tail = payload[cut + len(_PREFIX) : -len(_SUFFIX)]
        if tail[64 : 64 + len(_SIGNER)] == _SIGNER and tail[-128 - len(_SIG) : -128] == _SIG:
            signer, sig = tail[64 + len(_SIGNER) : 128 + len(_SIGNER)], tail[-128:]
            signature = Signature(signer.decode("ascii", "replace"), sig.decode("ascii", "replace"))
            return Sealed(payload[:cut] + b"}", tail[:64].decode("ascii", "replace"), signature)
    cut = len(payload) - _SEAL_LEN
    if cut <= 0 or payload[cut : cut + len(_PREFIX)] != _PREFIX:
        return None
    claimed = payload[cut + len(_PREFIX) : -len(_SUFFIX)].decode("ascii", "replace")
    return Sealed(payload[:cut] + b"}", claimed, None)


def check_link(head: ChainHead, run_id: str, subject_type: str, payload: bytes) -> Linked | Broken:
    """Whether `payload`, stored under `ftrain.run.<run_id>.<subject_type>`, is the next link after `head`."""
    parts = unseal(payload)
    if parts is None:
        return Broken("payload carries no hash")
    body, claimed = parts.body, parts.hash
    try:
        event = decode_event(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Broken(f"undecodable payload ({exc})")
    seq, etype = event.seq, event_type(event)
    if event.run_id != run_id or etype != subject_type:
        return Broken(
            f"stored under run {run_id!r} type {subject_type!r} but says {event.run_id!r} {etype!r}", seq
        )
    if not is_digest(event.prev_hash):
        return Broken(f"prev_hash {event.prev_hash[:12]}… is not 64 hex digits", seq, str(etype))
    if link_hash(event.prev_hash, body) != claimed:
        return Broken("hash mismatch: the payload was altered", seq, str(etype))
    if seq != head.seq + 1:
        return Broken(f"sequence gap: expected seq {head.seq + 1}, found {seq}", seq, str(etype))
    if event.prev_hash != head.hash:
        return Broken(
            f"prev_hash {event.prev_hash[:12]}… does not match the hash of seq {head.seq}", seq, str(etype)
        )
    return Linked(event, claimed, parts.signature)

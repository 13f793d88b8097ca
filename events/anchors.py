"""Anchors: signed notes, kept outside the stream, of what the stream held — pure format and checks.

In the spirit of a transparency log's signed checkpoint (origin, size, root, signature): each note names
the stream (its name and creation time, which a re-created stream cannot keep), the limits that decide what
it retains, the last stream sequence seen, and either one run's head (`run_id`, `seq`, `hash`: written by
the writer of that run's `checkpointed`, `resumed`, `failed` or `completed`) or, from `audit verify`, a
`root` over the first `stream_seq` records. A note that the stream no longer matches names what was lost.

The notes form a chain of their own, sealed exactly like events (`events.chain`): each line is a note's
canonical JSON, carrying `prev_hash`, followed by `"hash"` = SHA-256(prev_hash ‖ note) and the writer's
`"signer"`/`"sig"` over `ftrain-anchor-v1:` ‖ hash. So a reader checks one signature, on the last line,
plus the chain, whatever the file's length.
"""

import hashlib
from datetime import datetime

import msgspec

from events.chain import GENESIS, link_hash, seal, unseal
from events.schema import EPOCH, Count
from events.signing import ANCHOR_DOMAIN, Signature, Signer, TrustList, signature_valid

ROOT_PREFIX = "sha256:"


class Anchor(msgspec.Struct, frozen=True, kw_only=True):
    """One note: the stream as it was, and one run's head or (audit) the root of the whole prefix."""

    stream: str
    created: str
    config: dict[str, str]
    stream_seq: Count
    run_id: str | None = None
    seq: Count | None = None
    hash: str | None = None
    root: str | None = None
    time: datetime = EPOCH
    note: str = ""
    prev_hash: str = GENESIS


class StreamFacts(msgspec.Struct, frozen=True):
    """What the server says about the stream now: identity, retention limits, last sequence."""

    stream: str
    created: str
    config: dict[str, str]
    last_seq: int


class SignedAnchor(msgspec.Struct, frozen=True):
    """A note read back with its line hash and signature."""

    anchor: Anchor
    hash: str
    signature: Signature | None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Anchor)


def anchor_line(anchor: Anchor, signer: Signer) -> tuple[bytes, str]:
    """The line to append for `anchor` (whose prev_hash is the file's last hash), and its hash."""
    payload, digest = seal(
        _encoder.encode(anchor), anchor.prev_hash, lambda h: signer.sign(ANCHOR_DOMAIN, h.encode())
    )
    return payload + b"\n", digest


def read_line(line: bytes) -> SignedAnchor | None:
    """A line (without its newline) taken apart; None when it is not a sealed note (a torn write, junk)."""
    parts = unseal(line)
    if parts is None:
        return None
    try:
        anchor = _decoder.decode(parts.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if link_hash(anchor.prev_hash, parts.body) != parts.hash:
        return None
    return SignedAnchor(anchor, parts.hash, parts.signature)


def signed_by(note: SignedAnchor, trust: TrustList) -> str | None:
    """Why `note`'s signature does not vouch for it (None: a trusted writer signed it)."""
    if note.signature is None:
        return "unsigned"
    if not signature_valid(note.signature, ANCHOR_DOMAIN, note.hash.encode()):
        return "its signature does not verify"
    if trust.name(note.signature.signer) is None:
        return f"signed by {trust.describe(note.signature.signer)}"
    return None


def chain_of(lines: list[bytes]) -> tuple[list[SignedAnchor], list[str]]:
    """The notes of one anchor file that chain from its first, and what did not: torn or junk lines are
    skipped (a crash between write and flush leaves one), a note linking to anything but the previous good
    note is a finding."""
    notes: list[SignedAnchor] = []
    problems: list[str] = []
    for number, line in enumerate(lines, 1):
        note = read_line(line)
        if note is None:
            continue
        expected = notes[-1].hash if notes else GENESIS
        if note.anchor.prev_hash != expected:
            problems.append(
                f"line {number} does not follow the note before it (a line was removed or altered)"
            )
        notes.append(note)
    return notes, problems


def stream_change(anchored: Anchor, found: StreamFacts | None) -> str | None:
    """How the stream differs from the newest note (None: it is the stream anchored, not shorter)."""
    name = anchored.stream
    if found is None:
        return f"stream {name} is gone (anchored: created {anchored.created}, last seq {anchored.stream_seq})"
    if found.created != anchored.created:
        return f"stream {name} was re-created (anchored: created {anchored.created}; now {found.created})"
    changed = [
        f"{key} {anchored.config.get(key, '-')} → {found.config.get(key, '-')}"
        for key in sorted(anchored.config.keys() | found.config.keys())
        if anchored.config.get(key) != found.config.get(key)
    ]
    if changed:
        return f"stream {name}'s configuration changed: {', '.join(changed)}"
    if found.last_seq < anchored.stream_seq:
        return (
            f"stream {name} went back from seq {anchored.stream_seq} to {found.last_seq} "
            "(restored from an older copy, or truncated)"
        )
    return None


class PrefixRoot:
    """The root audit anchors carry: SHA-256 over `<stream seq> <run> <type> <payload length>\n<payload>` of
    every record from the first, so any change to the first N records changes the root at N."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self.size = 0

    def add(self, stream_seq: int, run_id: str, event_type: str, payload: bytes) -> None:
        """Fold in the next record."""
        head = f"{stream_seq} {run_id} {event_type} {len(payload)}\n"
        self._digest.update(head.encode())
        self._digest.update(payload)
        self.size = stream_seq

    def value(self) -> str:
        """The root so far."""
        return ROOT_PREFIX + self._digest.hexdigest()

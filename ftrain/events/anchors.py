"""Anchors: signed notes, kept outside the stream, of what the stream held — pure format and checks.

In the spirit of a transparency log's signed checkpoint (origin, size, root, signature): each note names
the stream (its name and creation time, which a re-created stream cannot keep), the limits that decide what
it retains, the last stream sequence seen, and either one run's head (`run_id`, `seq`, `head_hash`: written
by the writer of that run's `checkpointed`, `resumed`, `failed` or `completed`) or, from `audit verify`, a
`root` over the first `stream_seq` records. A note that the stream no longer matches names what was lost.

The notes form a chain of their own, sealed exactly like events (`events.chain`): each line is a note's
canonical JSON, carrying `prev_hash`, followed by `"hash"` = SHA-256(prev_hash ‖ note) and the writer's
`"signer"`/`"sig"` over `ftrain-anchor-v1:` ‖ hash. Format 2 (`"format":2`, its first member) names the run
head `head_hash`, so every member name is unique (RFC 8259); format 1 lines (no `format`) named it `hash`,
twice with the seal's, and still read and verify: hashes are over the stored bytes.

Only notes a trusted writer vouches for count (`walk_back`, for every reader): the last line signed by a
trusted key, and the notes its chain links to. A writer chains only onto such a note, so one signature
vouches for the file whatever its length; a line no trusted note links to (unsigned, signed by another key,
a copy of an older note) is reported and ignored.
"""

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

import msgspec

from ftrain.events.chain import GENESIS, is_digest, link_hash, seal, unseal
from ftrain.events.schema import EPOCH, Count
from ftrain.events.signing import ANCHOR_DOMAIN, Signature, Signer, TrustList, signature_valid

ROOT_PREFIX = "sha256:"
FORMAT = 2
"""The note format written: 2 names the run head `head_hash`; 1 (no `format` member) named it `hash`."""


class Anchor(msgspec.Struct, frozen=True, kw_only=True):
    """One note: the stream as it was, and one run's head or (audit) the root of the whole prefix."""

    format: int = FORMAT
    stream: str
    created: str
    config: dict[str, str]
    stream_seq: Count
    run_id: str | None = None
    seq: Count | None = None
    head_hash: str | None = None
    root: str | None = None
    time: datetime = EPOCH
    note: str = ""
    prev_hash: str = GENESIS


class _Stored(Anchor, frozen=True, kw_only=True):
    """What a line's body may hold: a format 1 note has no `format` and names the run head `hash`."""

    format: int = 1
    hash: str | None = None


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
_stored_decoder = msgspec.json.Decoder(_Stored)
_WRITTEN = b'{"format":%d,' % FORMAT


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
        anchor = _read_body(parts.body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not is_digest(anchor.prev_hash) or link_hash(anchor.prev_hash, parts.body) != parts.hash:
        return None
    return SignedAnchor(anchor, parts.hash, parts.signature)


def _read_body(body: bytes) -> Anchor:
    """A note's body in either format: as written today (the `format` member first) at once; otherwise
    through the reader of both, which takes a format 1 note's run head from its `hash`."""
    if body.startswith(_WRITTEN):
        return _decoder.decode(body)
    stored = _stored_decoder.decode(body)
    fields = {name: getattr(stored, name) for name in Anchor.__struct_fields__}
    if stored.format == 1:
        fields["head_hash"] = stored.hash
    return Anchor(**fields)


def signed_by(note: SignedAnchor, trust: TrustList) -> str | None:
    """Why `note`'s signature does not vouch for it (None: a trusted writer signed it)."""
    if note.signature is None:
        return "unsigned"
    if trust.name(note.signature.signer) is None:  # first: a stranger's lines cost no signature check
        return f"signed by {trust.describe(note.signature.signer)}"
    if not signature_valid(note.signature, ANCHOR_DOMAIN, note.hash.encode()):
        return "its signature does not verify"
    return None


class Kept(msgspec.Struct, frozen=True):
    """A note that counts, at `position` in its file (a line number or a byte offset); `follows`: False when
    the note it links to is not in the file (a line was removed or altered: the note itself is vouched)."""

    position: int
    note: SignedAnchor
    follows: bool = True


class Ignored(msgspec.Struct, frozen=True):
    """A line that does not count, and why (no trusted note vouches for it)."""

    position: int
    why: str


def walk_back(notes: Iterable[tuple[int, SignedAnchor]], trust: TrustList) -> Iterator[Kept | Ignored]:
    """What counts among one file's notes, given newest first, as (position, note): the newest note signed
    by a trusted key, then each note the kept one links to (vouched by the chain, no signature to check).
    Lines passed over on the way are ignored (another's, or no one's); a kept note that a passed line copies
    is the copy (an older note appended again) and is ignored instead. Lazy: a reader of the newest note
    reads (and checks the signature of) one line and the one it links to, unless the file was tampered with."""
    source: Iterator[tuple[int, SignedAnchor]] = iter(notes)
    candidate: tuple[int, SignedAnchor] | None = None  # kept, the note it links to not found yet
    passed: list[tuple[int, SignedAnchor]] = []
    while True:
        item = next(source, None)
        if candidate is None:
            if item is None:
                return
            why = signed_by(item[1], trust)
            if why is None:
                candidate = item
            else:
                yield Ignored(item[0], why)
            continue
        expected = candidate[1].anchor.prev_hash
        if item is not None and item[1].hash != expected:
            passed.append(item)
            continue
        copied = next((p for p in passed if p[1].hash == candidate[1].hash), None)
        if copied is not None:  # the candidate repeats a line before it: that one is in its place
            yield Ignored(candidate[0], "a copy of an earlier note")
            source = itertools.chain(passed, [item] if item else [], source)
            candidate, passed = None, []
            continue
        if item is None and expected != GENESIS:  # what it links to is gone: it counts, the gap is named
            yield Kept(*candidate, follows=False)
            source, candidate, passed = iter(passed), None, []
            continue
        for position, note in passed:
            yield Ignored(position, signed_by(note, trust) or "not on the file's chain")
        yield Kept(*candidate)
        if item is None:
            return
        candidate, passed = item, []


BROKEN_LINK = "does not follow the note before it (a line was removed or altered)"
IGNORED = ": ignored"
"""How a finding about lines that do not count ends: reported, never held against the log."""


def findings(walked: Iterable[Kept | Ignored], where: Callable[[int, int], str]) -> list[str]:
    """`walk_back`'s findings as lines, in the order walked: each gap, and each run of ignored lines with
    one reason as one line; `where(first, last)` names positions ("line 3", "lines 3-9")."""
    found: list[str] = []
    run: list[Ignored] = []

    def flush() -> None:
        if run:
            found.append(f"{where(run[-1].position, run[0].position)} {_verb(run)} {run[0].why}{IGNORED}")
            run.clear()

    for step in walked:
        if isinstance(step, Ignored) and run and run[-1].why != step.why:
            flush()
        if isinstance(step, Ignored):
            run.append(step)
            continue
        flush()
        if not step.follows:
            found.append(f"{where(step.position, step.position)} {BROKEN_LINK}")
    flush()
    return found


def _verb(run: list[Ignored]) -> str:
    return "is" if len(run) == 1 else "are"


def lines_where(first: int, last: int) -> str:
    """Line numbers as findings name them."""
    return f"line {first}" if first == last else f"lines {first}-{last}"


def chain_of(lines: list[bytes], trust: TrustList) -> tuple[list[SignedAnchor], list[str]]:
    """The notes of one anchor file that count, oldest first, and what did not (`walk_back`); torn or junk
    lines are skipped (a crash between write and flush leaves one)."""
    backwards = (
        (number, note) for number in range(len(lines), 0, -1) if (note := read_line(lines[number - 1]))
    )
    notes: list[SignedAnchor] = []

    def keeping(walked: Iterator[Kept | Ignored]) -> Iterator[Kept | Ignored]:
        for step in walked:
            if isinstance(step, Kept):
                notes.append(step.note)
            yield step

    problems = findings(keeping(walk_back(backwards, trust)), lines_where)
    return notes[::-1], problems[::-1]


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

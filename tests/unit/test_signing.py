"""Signatures and anchors, pure: the signed vectors a third party reproduces, who vouches for a run, and
how an anchor file chains and names what changed. No server."""

import fcntl
import hashlib
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ftrain.domain.chain_walk import ChainWalk, Finding
from ftrain.domain.vouching import Vouched
from ftrain.events.anchor_file import AnchorBusy, AnchorFiles, read_lines
from ftrain.events.anchors import (
    Anchor,
    PrefixRoot,
    StreamFacts,
    anchor_line,
    chain_of,
    read_line,
    signed_by,
    stream_change,
)
from ftrain.events.chain import GENESIS, ChainHead, seal, unseal
from ftrain.events.keyring import KeyringError, load_signer, load_trust, revoke, trust
from ftrain.events.record import StoredRecord, parse_subject
from ftrain.events.schema import encode_event
from ftrain.events.signing import (
    EVENT_DOMAIN,
    Signature,
    Signer,
    TrustList,
    parse_public_key,
    signature_valid,
)
from ftrain.projections.log_anchors import AnchorCheck
from tests.support.builders import T0, checkpointed, launched
from tests.support.paths import VECTORS as VECTOR_DIR
from tests.unit.test_formats import vector_events, verified_body

VECTORS = json.loads((VECTOR_DIR / "signed-events.json").read_text("utf-8"))
RUN = "vector-run"


def key() -> Signer:
    return Signer(Ed25519PrivateKey.generate())


# -- the signed vectors ----------------------------------------------------------------------------------


def test_each_signed_vector_verifies_with_nothing_but_hashlib_and_ed25519() -> None:
    """What the README tells a verifier: strip the trailing members, hash, check the signature over
    `ftrain-event-v1:` ‖ hash with the writer's public key."""
    public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(VECTORS["public_key"]))
    prev = GENESIS
    for vector in VECTORS["events"]:
        payload = vector["payload"].encode()
        body = verified_body(payload, vector, prev, public, b"ftrain-event-v1:")
        assert unseal(payload) == (body, vector["hash"], Signature(vector["signer"], vector["sig"]))
        prev = vector["hash"]


def test_sealing_the_vector_events_with_the_vector_key_reproduces_them_byte_for_byte() -> None:
    signer = Signer(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(VECTORS["private_key_seed"])))
    assert signer.public_key == VECTORS["public_key"]
    for event, vector in zip(vector_events(), VECTORS["events"], strict=True):
        body = encode_event(msgspec.structs.replace(event, prev_hash=vector["prev_hash"]))
        assert seal(body, vector["prev_hash"], signer.sign_hash) == (
            vector["payload"].encode(),
            vector["hash"],
        )


def test_the_signed_vector_chain_is_vouched_for_by_its_key_when_trusted_and_by_nobody_otherwise() -> None:
    trusted = TrustList({VECTORS["public_key"]: "vector-writer"})
    for trust_list, expected in ((trusted, Vouched("vector-writer")), (TrustList(), None)):
        walk = ChainWalk(trust=trust_list)
        for n, vector in enumerate(VECTORS["events"], 1):
            run_id, event_type = parse_subject(vector["subject"])
            walk.feed(record(n, run_id, event_type, vector["payload"].encode()))
        verdict = walk.vouched(RUN)
        if expected is not None:
            assert verdict == expected
        else:
            assert isinstance(verdict, Finding) and verdict.seq == 1 and "untrusted key" in verdict.reason


# -- who vouches for a run -------------------------------------------------------------------------------


def record(stream_seq: int, run_id: str, event_type: str, payload: bytes) -> StoredRecord:
    return StoredRecord(stream_seq, run_id, event_type, payload)


def chain(signers: list[Signer | None], run_id: str = "r") -> list[StoredRecord]:
    """A run launched, then checkpointed, each event sealed by the given signer (None: unsigned)."""
    head, out = ChainHead(), []
    for n, signer in enumerate(signers, 1):
        event = launched(run_id) if n == 1 else checkpointed(run_id, 10 * n)
        event = msgspec.structs.replace(event, seq=n, prev_hash=head.hash, time=T0)
        payload, digest = seal(encode_event(event), head.hash, signer.sign_hash if signer else None)
        out.append(StoredRecord(n, run_id, "launched" if n == 1 else "checkpointed", payload))
        head = ChainHead(n, digest, n)
    return out


def verdict(records: list[StoredRecord], trust: TrustList) -> Vouched | Finding | None:
    walk = ChainWalk(trust=trust)
    for r in records:
        walk.feed(r)
    return walk.vouched(records[0].run_id)


def test_a_trusted_signature_on_the_newest_event_vouches_for_the_whole_run() -> None:
    alice = key()
    trust = TrustList({alice.public_key: "alice"})
    assert verdict(chain([alice, alice, alice]), trust) == Vouched("alice")
    # an unsigned prefix (a log from before signing) is vouched for once a trusted writer appends on it
    assert verdict(chain([None, None, alice]), trust) == Vouched("alice")


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        ("unsigned", "unsigned"),
        ("mallory", "signed by untrusted key ed25519:"),
        ("revoked", "signed by revoked key ed25519:"),
    ],
)
def test_the_first_event_after_the_last_trusted_signature_is_named(tail: str, reason: str) -> None:
    alice, mallory, old = key(), key(), key()
    trust = TrustList({alice.public_key: "alice"}, {old.public_key: "old laptop"})
    signer = {"unsigned": None, "mallory": mallory, "revoked": old}[tail]
    found = verdict(chain([alice, alice, signer, signer]), trust)
    assert isinstance(found, Finding)
    assert (found.seq, found.stream_seq, found.event_type) == (3, 3, "checkpointed")
    assert found.reason.startswith(reason)


def test_a_signature_claiming_a_trusted_key_that_does_not_verify_is_named() -> None:
    alice = key()
    records = chain([alice, alice])
    forged = records[1].payload[:-130] + b"0" * 128 + b'"}'  # alice's key, someone else's signature
    found = verdict(
        [records[0], StoredRecord(2, "r", "checkpointed", forged)], TrustList({alice.public_key: "alice"})
    )
    assert isinstance(found, Finding) and found.seq == 2 and "does not verify" in found.reason


def test_a_signature_copied_from_another_event_does_not_verify() -> None:
    alice = key()
    records = chain([alice, alice, None])
    copied = unseal(records[1].payload)
    assert copied is not None and copied.signature is not None
    third = unseal(records[2].payload)
    assert third is not None
    payload, _ = seal(third.body, copied.hash, lambda _h: copied.signature)  # type: ignore[arg-type,return-value]
    found = verdict(
        [*records[:2], StoredRecord(3, "r", "checkpointed", payload)], TrustList({alice.public_key: "a"})
    )
    assert isinstance(found, Finding) and "does not verify" in found.reason


def test_an_unsigned_run_is_acted_on_only_when_the_trust_list_says_so() -> None:
    records = chain([None, None])
    refused = verdict(records, TrustList())
    assert isinstance(refused, Finding) and refused.seq == 1 and refused.reason == "unsigned"
    assert verdict(records, TrustList(accept_unsigned=True)) == Vouched(None)
    # but a forgery signed by an unknown key is never "unsigned", accepted or not
    assert isinstance(verdict(chain([None, key()]), TrustList(accept_unsigned=True)), Finding)


def test_signatures_are_domain_separated_between_events_and_anchors() -> None:
    alice = key()
    as_anchor = alice.sign(b"ftrain-anchor-v1:", b"a" * 64)
    assert not signature_valid(as_anchor, EVENT_DOMAIN, b"a" * 64)
    assert signature_valid(alice.sign_hash("a" * 64), EVENT_DOMAIN, b"a" * 64)
    assert not signature_valid(Signature("zz", "00"), EVENT_DOMAIN, b"a" * 64)


# -- keys on disk ----------------------------------------------------------------------------------------


def test_the_key_is_made_once_private_and_trusted_under_its_name(tmp_path: Path) -> None:
    first = load_signer(tmp_path, "alice@login1")
    assert load_signer(tmp_path, "ignored").public_key == first.public_key
    keys = tmp_path / "keys"
    assert keys.stat().st_mode & 0o777 == 0o700
    assert {p.name: p.stat().st_mode & 0o777 for p in keys.iterdir() if not p.name.startswith(".")} == {
        "signing.key": 0o600,
        "trusted": 0o600,
    }
    assert load_trust(tmp_path).trusted == {first.public_key: "alice@login1"}


def test_trust_revoke_and_retrust(tmp_path: Path) -> None:
    bob = key().public_key
    trust(tmp_path, f"ed25519:{bob}", "bob")
    assert load_trust(tmp_path).name(bob) == "bob"
    assert revoke(tmp_path, "bob") == [(bob, "bob")]
    listed = load_trust(tmp_path)
    assert listed.name(bob) is None and listed.revoked == {bob: "bob"}
    assert "revoked key" in listed.describe(bob)
    trust(tmp_path, bob, "bob")
    assert load_trust(tmp_path).name(bob) == "bob" and load_trust(tmp_path).revoked == {}
    assert revoke(tmp_path, "nobody") == []


def test_a_key_file_others_can_read_or_a_malformed_trust_list_is_refused(tmp_path: Path) -> None:
    load_signer(tmp_path, "a")
    (tmp_path / "keys" / "signing.key").chmod(0o644)
    with pytest.raises(KeyringError, match="readable by other users"):
        load_signer(tmp_path, "a")
    (tmp_path / "keys" / "trusted").write_text("ed25519:nothex bob\n")
    with pytest.raises(KeyringError, match=r"trusted:1: .* is not an Ed25519 public key"):
        load_trust(tmp_path)
    with pytest.raises(ValueError, match="not an Ed25519 public key"):
        parse_public_key("ed25519:" + "g" * 64)


# -- anchors ---------------------------------------------------------------------------------------------

FACTS = StreamFacts("FTRAIN_EVENTS", "2026-01-01 00:00:00", {"max_age": "0.0", "deny_delete": "True"}, 10)


def note(**fields: object) -> Anchor:
    base: dict[str, object] = {"stream": FACTS.stream, "created": FACTS.created, "config": FACTS.config}
    return Anchor(**{**base, "stream_seq": 10, "time": T0, **fields})  # type: ignore[arg-type]


def test_anchor_notes_chain_per_file_and_one_signature_vouches_for_the_file(tmp_path: Path) -> None:
    alice = key()
    trusted = TrustList({alice.public_key: "alice"})
    files = AnchorFiles([tmp_path / "a.log", tmp_path / "mirror" / "a.log"], alice, trusted)
    files.append([note(run_id="r", seq=1, head_hash="a" * 64), note(run_id="r", seq=2, head_hash="b" * 64)])
    files.append([note(stream_seq=12, time=T0 + timedelta(seconds=1))])
    for path in files.paths:
        assert path.stat().st_mode & 0o777 == 0o600
        notes, problems = chain_of(read_lines(path), trusted)
        assert problems == [] and [n.anchor.seq for n in notes] == [1, 2, None]
        assert signed_by(notes[-1], trusted) is None
        assert signed_by(notes[-1], TrustList()) is not None
    assert files.newest() == (
        msgspec.structs.replace(
            note(stream_seq=12, time=T0 + timedelta(seconds=1)), prev_hash=notes[-2].hash
        ),
        [],
    )


def test_a_removed_anchor_line_is_named_and_a_torn_one_skipped(tmp_path: Path) -> None:
    alice = key()
    trusted = TrustList({alice.public_key: "alice"})
    files = AnchorFiles([tmp_path / "a.log"], alice, trusted)
    files.append([note(run_id="r", seq=n, head_hash="a" * 64) for n in (1, 2, 3)])
    lines = read_lines(files.paths[0])
    assert chain_of([lines[0], lines[2]], trusted)[1] == [
        "line 2 does not follow the note before it (a line was removed or altered)"
    ]
    torn = lines[2][:40]
    (tmp_path / "a.log").write_bytes(b"".join(line + b"\n" for line in lines) + torn)
    files.append([note(run_id="r", seq=4, head_hash="a" * 64)])  # starts on a fresh line, chained to seq 3
    notes, problems = chain_of(read_lines(files.paths[0]), trusted)
    assert problems == [] and [n.anchor.seq for n in notes] == [1, 2, 3, 4]
    assert read_line(b"junk") is None


@pytest.mark.parametrize(
    ("found", "says"),
    [
        (None, "stream FTRAIN_EVENTS is gone (anchored: created 2026-01-01 00:00:00, last seq 10)"),
        (
            msgspec.structs.replace(FACTS, created="2026-02-02"),
            "was re-created (anchored: created 2026-01-01 00:00:00; now 2026-02-02)",
        ),
        (
            msgspec.structs.replace(FACTS, config={**FACTS.config, "max_age": "60.0"}),
            "configuration changed: max_age 0.0 → 60.0",
        ),
        (msgspec.structs.replace(FACTS, last_seq=7), "went back from seq 10 to 7"),
        (msgspec.structs.replace(FACTS, last_seq=11), None),
    ],
    ids=["gone", "re-created", "reconfigured", "rolled-back", "grown"],
)
def test_the_stream_is_compared_with_the_newest_anchor(found: StreamFacts | None, says: str | None) -> None:
    change = stream_change(note(), found)
    assert change is None if says is None else (change is not None and says in change)


def test_an_audit_root_covers_every_record_and_a_rewritten_prefix_is_named() -> None:
    records = chain([key(), key()], "a") + chain([None], "b")
    records = [msgspec.structs.replace(r, stream_seq=n) for n, r in enumerate(records, 1)]
    expected = hashlib.sha256()
    for r in records:
        expected.update(f"{r.stream_seq} {r.run_id} {r.event_type} {len(r.payload)}\n".encode() + r.payload)
    root = PrefixRoot()
    for r in records:
        root.add(r.stream_seq, r.run_id, r.event_type, r.payload)
    assert (root.size, root.value()) == (3, "sha256:" + expected.hexdigest())

    audited = note(stream_seq=3, root=root.value())
    for rewritten, says in (
        (records, []),
        ([*records[:2], records[1]], ["differ from those an audit anchored"]),
    ):
        check = AnchorCheck([audited], [], None)
        walk = ChainWalk()
        for n, r in enumerate(rewritten, 1):
            r = msgspec.structs.replace(r, stream_seq=n)
            check.feed(r, walk.feed(r))
        found = check.stream_findings(msgspec.structs.replace(FACTS, last_seq=3))
        assert [f for f in found if any(s in f for s in says)] == found and len(found) == len(says)


# -- every branch of the pure parts, named by what it decides -------------------------------------------------

SIG = "ab" * 64
SIGNER_HEX = "cd" * 32


def signed_payload(body: bytes = b'{"a":1}') -> bytes:
    return body[:-1] + f',"hash":"{"e" * 64}","signer":"{SIGNER_HEX}","sig":"{SIG}"}}'.encode()


def test_the_smallest_signed_payload_unseals_and_one_without_a_body_does_not() -> None:
    smallest = signed_payload(b"{}")  # `{` then the trailer: an empty body
    assert smallest.startswith(b'{,"hash"')
    assert unseal(smallest) == (b"{}", "e" * 64, Signature(SIGNER_HEX, SIG))
    assert unseal(smallest[1:]) is None  # the trailer alone: no object to close


@pytest.mark.parametrize(
    ("old", "new"),
    [(b',"hash":"', b',"hasx":"'), (b'","signer":"', b'","signex":"'), (b'","sig":"', b'","siq":"')],
    ids=["hash-key", "signer-key", "sig-key"],
)
def test_a_signed_trailer_with_any_key_altered_is_not_sealed(old: bytes, new: bytes) -> None:
    altered = signed_payload().replace(old, new)
    assert len(altered) == len(signed_payload()) and unseal(altered) is None


def test_non_ascii_bytes_where_hex_belongs_read_as_replacement_characters_never_an_error() -> None:
    payload = signed_payload()
    for field in (b"e" * 64, SIGNER_HEX.encode(), SIG.encode()):
        forged = payload.replace(field, b"\xff\xfe" + field[2:], 1)
        parts = unseal(forged)
        assert parts is not None
        seen = (
            parts.hash,
            parts.signature.signer if parts.signature else "",
            parts.signature.sig if parts.signature else "",
        )
        assert any(value.startswith("\ufffd\ufffd") for value in seen)


def test_a_signature_is_valid_only_in_canonical_lowercase_hex() -> None:
    alice = key()
    good = alice.sign_hash("a" * 64)
    assert signature_valid(good, EVENT_DOMAIN, b"a" * 64)
    assert not signature_valid(Signature(good.signer, good.sig.upper()), EVENT_DOMAIN, b"a" * 64)
    assert not signature_valid(Signature(good.signer.upper(), good.sig), EVENT_DOMAIN, b"a" * 64)


def test_the_trust_list_names_trusted_untrusted_and_revoked_keys_exactly() -> None:
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    trust_list = TrustList({a: "alice", c: "carol"}, {c: "carol"})
    assert (trust_list.name(a), trust_list.name(b), trust_list.name(c)) == ("alice", None, None)
    assert trust_list.describe(a) == f"alice (ed25519:{a[:16]}…)"
    assert trust_list.describe(b) == f"untrusted key ed25519:{b[:16]}…"
    assert trust_list.describe(c) == f"revoked key ed25519:{c[:16]}… (carol)"
    with pytest.raises(
        ValueError, match=r"^'" + "x" * 80 + r"' is not an Ed25519 public key \(ed25519:<64 hex digits>\)$"
    ):
        parse_public_key("x" * 100)


def test_a_bad_signature_is_named_at_its_event_and_never_cached_for_another_run() -> None:
    alice = key()
    trust_list = TrustList({alice.public_key: "alice"})
    good, bad = chain([alice, alice], "good"), chain([alice, alice], "bad")
    forged = bad[1].payload[:-130] + b"0" * 128 + b'"}'
    walk = ChainWalk(trust=trust_list)
    for n, r in enumerate([*good, bad[0], StoredRecord(0, "bad", "checkpointed", forged)], 1):
        walk.feed(msgspec.structs.replace(r, stream_seq=n))
    assert walk.vouched("good") == Vouched("alice")
    found = walk.vouched("bad")
    assert isinstance(found, Finding)
    assert (found.seq, found.stream_seq, found.event_type) == (2, 4, "checkpointed")
    assert walk.vouched("good") == Vouched("alice")


def test_an_anchor_note_is_named_unsigned_or_badly_signed_exactly(tmp_path: Path) -> None:
    alice = key()
    line, _ = anchor_line(note(), alice)
    signed = read_line(line.removesuffix(b"\n"))
    assert signed is not None and signed.signature is not None
    assert signed_by(msgspec.structs.replace(signed, signature=None), TrustList()) == "unsigned"
    wrong = msgspec.structs.replace(signed, signature=Signature(alice.public_key, "0" * 128))
    assert signed_by(wrong, TrustList({alice.public_key: "alice"})) == "its signature does not verify"
    assert read_line(line) is None  # a line keeps no newline: the reader's contract


def test_a_changed_stream_is_described_key_by_key() -> None:
    changed = msgspec.structs.replace(FACTS, config={"max_age": "60.0", "max_bytes": "5"})
    assert stream_change(note(), changed) == (
        "stream FTRAIN_EVENTS's configuration changed: deny_delete True → -, max_age 0.0 → 60.0, max_bytes - → 5"
    )
    assert stream_change(note(), msgspec.structs.replace(FACTS, last_seq=9)) == (
        "stream FTRAIN_EVENTS went back from seq 10 to 9 (restored from an older copy, or truncated)"
    )
    assert PrefixRoot().size == 0


def test_an_anchor_file_held_by_a_stopped_process_never_stalls_a_writer(tmp_path: Path) -> None:
    alice = key()
    trusted = TrustList({alice.public_key: "alice"})
    files = AnchorFiles([tmp_path / "a.log"], alice, trusted)
    files.append([note(run_id="r", seq=1, head_hash="a" * 64)])
    holder = os.open(tmp_path / "a.log", os.O_RDONLY)  # another open file: its flock excludes ours
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(AnchorBusy, match="locked by another process for 2 s"):
            files.append([note(run_id="r", seq=2, head_hash="b" * 64)])
        assert 1.9 < time.monotonic() - started < 5
    finally:
        os.close(holder)
    files.append([note(run_id="r", seq=2, head_hash="b" * 64)])  # released: written, chained after seq 1
    assert [n.anchor.seq for n in chain_of(read_lines(files.paths[0]), trusted)[0]] == [1, 2]

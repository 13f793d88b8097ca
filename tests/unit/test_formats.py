"""Test vectors for every persisted format, checked byte for byte: what a third-party verifier must reproduce.

`tests/vectors/events.json` is one run's chain from genesis: each stored payload, the hash before it and its
own. `tests/vectors/checkpoint/` is a sealed checkpoint (data file, manifest, marker) and
`tests/vectors/checkpoint.json` the digest of each. `tests/vectors/anchors.json` is an anchor file whose
lines mix both note formats, signed with the key of `signed-events.json`. The README's "Test vectors for verifiers" describes them.
"""

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import blake3
import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ftrain.events.anchors import Anchor, anchor_line, chain_of, read_line
from ftrain.events.chain import GENESIS, Broken, ChainHead, Linked, check_link, seal, unseal
from ftrain.events.record import parse_subject, run_subject
from ftrain.events.run_id import RUN_ID_MAX, InvalidRunId, validate_run_id
from ftrain.events.schema import (
    MAX_EVENT_BYTES,
    Actor,
    AnyEvent,
    Checkpointed,
    Completed,
    CorruptSkipped,
    Failed,
    InvalidEvent,
    Launched,
    Resumed,
    decode_event,
    encode_event,
    now,
)
from ftrain.events.signing import Signer, TrustList
from ftrain.events.stored_schema import stored_schema
from ftrain.workers.integrity import Digest, DigestField, HexField, digest_of, from_hex, to_hex
from ftrain.workers.manifest import (
    FORMAT,
    FileEntry,
    Manifest,
    Marker,
    decode_manifest,
    decode_marker,
    encode_manifest,
)
from tests.support.paths import VECTORS

EVENTS: list[dict[str, str]] = json.loads((VECTORS / "events.json").read_text("utf-8"))
LEGACY_EVENTS: list[dict[str, str]] = json.loads((VECTORS / "events-before-attempts.json").read_text("utf-8"))
"""The same chain as written before events carried their attempt: stored bytes verify whatever the schema
has become since (hashes are over stored bytes, never a re-encoding)."""
CHECKPOINT = VECTORS / "checkpoint"
ANCHORS: dict[str, Any] = json.loads((VECTORS / "anchors.json").read_text("utf-8"))
SIGNING_SEED = json.loads((VECTORS / "signed-events.json").read_text("utf-8"))["private_key_seed"]
DIGESTS: dict[str, str] = json.loads((VECTORS / "checkpoint.json").read_text("utf-8"))

T = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RUN = "vector-run"
URI = "file:///ckpt/vector-run/step-100"
COMMAND = ("torchrun", "--nnodes=2", "-m", "train")
CHECKPOINT_HASH = DIGESTS["checkpoint_hash"]
ROOT = "sha256:4ccb88aa1551cded0e7ce3f0d16765f7a5292e7398b730dc6ef5fc8941d24425"
"""The audit note's root: over the records of `events.json` as stream seqs 1-6 (docs/event-log.md)."""


def vector_events() -> list[AnyEvent]:
    """The events of `events.json`, built field by field (their `prev_hash` is filled in from the vectors)."""
    return [
        Launched(run_id=RUN, seq=1, id="01J0000000000000000000000A", time=T, actor=Actor("ops@login1", "login1", 4242),
                 project="llm", strategy="fsdp", nodes=2, gpus_per_node=8, hosts=("gpu01", "gpu02"),
                 allocation_source="nodelist", rdzv_endpoint="gpu01:29500", command=COMMAND, storage="file:///ckpt"),
        Checkpointed(run_id=RUN, seq=2, id="01J0000000000000000000000B", time=T.replace(minute=30),
                     actor=Actor("ops", "gpu01", 7, 0), step=100, epoch=1, shards=1, uri=URI,
                     checkpoint_hash=CHECKPOINT_HASH, size_bytes=12, attempt=1),
        Failed(run_id=RUN, seq=3, id="01J0000000000000000000000C", time=T.replace(hour=13), reason="preempted",
               exit_code=143, message="SIGTERM", attempt=1),
        Resumed(run_id=RUN, seq=4, id="01J0000000000000000000000D", time=T.replace(hour=14), checkpoint_seq=2,
                step=100, epoch=1, uri=URI, checkpoint_hash=CHECKPOINT_HASH, resume_count=1, command=COMMAND, attempt=2),
        CorruptSkipped(run_id=RUN, seq=5, id="01J0000000000000000000000E", time=T.replace(hour=15),
                       checkpoint_seq=2, step=100, uri=URI, reason="hash mismatch"),
        Completed(run_id=RUN, seq=6, id="01J0000000000000000000000F", time=T.replace(hour=16), cost_gpu_hours=64.0,
                  running_seconds=14400.0, cost_source="reported", attempt=2),
    ]  # fmt: skip


# -- the event log -------------------------------------------------------------------------------------------


def test_genesis_is_64_ascii_zeros_as_the_readme_documents() -> None:
    assert GENESIS == "0000000000000000000000000000000000000000000000000000000000000000"
    assert ChainHead() == ChainHead(0, GENESIS, 0)
    assert EVENTS[0]["prev_hash"] == GENESIS


@pytest.mark.parametrize("vectors", [EVENTS, LEGACY_EVENTS], ids=["current", "before-attempts"])
def test_each_stored_payload_hashes_to_its_vector_byte_for_byte(vectors: list[dict[str, str]]) -> None:
    """hash = SHA-256(prev hash as ASCII hex ‖ the payload without its trailing `,"hash":"…"` member)."""
    prev = GENESIS
    for vector in vectors:
        payload = vector["payload"].encode("utf-8")
        suffix = f',"hash":"{vector["hash"]}"}}'.encode("ascii")
        assert vector["prev_hash"] == prev and payload.endswith(suffix)
        body = payload[: -len(suffix)] + b"}"
        assert hashlib.sha256(prev.encode("ascii") + body).hexdigest() == vector["hash"]
        assert unseal(payload) == (body, vector["hash"], None)
        prev = vector["hash"]


def test_the_canonical_encoding_of_each_event_is_the_stored_body_byte_for_byte() -> None:
    for event, vector in zip(vector_events(), EVENTS, strict=True):
        stamped = msgspec.structs.replace(event, prev_hash=vector["prev_hash"])
        body = encode_event(stamped)
        assert seal(body, vector["prev_hash"]) == (vector["payload"].encode("utf-8"), vector["hash"])
        assert decode_event(vector["payload"].encode("utf-8")) == stamped


@pytest.mark.parametrize("vectors", [EVENTS, LEGACY_EVENTS], ids=["current", "before-attempts"])
def test_the_vector_chain_links_from_genesis_under_its_subjects(vectors: list[dict[str, str]]) -> None:
    head = ChainHead()
    for n, vector in enumerate(vectors, start=1):
        run_id, subject_type = parse_subject(vector["subject"])
        assert vector["subject"] == run_subject(run_id, subject_type)
        link = check_link(head, run_id, subject_type, vector["payload"].encode("utf-8"))
        assert isinstance(link, Linked), link
        head = ChainHead(n, link.hash, n)
    assert head.hash == vectors[-1]["hash"]


def test_a_chain_that_starts_anywhere_but_genesis_is_broken() -> None:
    first = EVENTS[0]["payload"].encode("utf-8")
    link = check_link(ChainHead(0, "1" * 64, 0), RUN, "launched", first)
    assert link == Broken("prev_hash 000000000000… does not match the hash of seq 0", 1, "launched")


@pytest.mark.parametrize(
    "payload",
    [
        b',"hash":"' + b"a" * 64 + b'"}',  # the seal alone, no event before it
        b'{"type":"failed","run_id":"r","hash":"' + b"a" * 64 + b'"]',  # not closed by `"}`
        b'{"type":"failed","run_id":"r","hush":"' + b"a" * 64 + b'"}',  # no `,"hash":"` member
        b'{"type":"failed","run_id":"r"}',
    ],
    ids=["seal-only", "wrong-closing", "wrong-member", "no-hash"],
)
def test_a_payload_is_sealed_only_when_a_full_hash_member_closes_an_event(payload: bytes) -> None:
    assert unseal(payload) is None
    assert check_link(ChainHead(), "r", "failed", payload) == Broken("payload carries no hash")


def test_the_smallest_sealed_payload_unseals() -> None:
    assert unseal(b'{,"hash":"' + b"a" * 64 + b'"}') == (b"{}", "a" * 64, None)


def failed_link(seq: int, prev: str, run_id: str = "r1") -> bytes:
    return seal(encode_event(Failed(run_id=run_id, seq=seq, prev_hash=prev, reason="preempted")), prev)[0]


def test_each_broken_link_names_what_broke_its_seq_and_its_type() -> None:
    head = ChainHead(1, "1" * 64, 1)
    assert check_link(head, "x", "failed", failed_link(2, head.hash)) == Broken(
        "stored under run 'x' type 'failed' but says 'r1' 'failed'", 2
    )
    altered = failed_link(2, head.hash).replace(b"preempted", b"oom")
    assert check_link(head, "r1", "failed", altered) == Broken(
        "hash mismatch: the payload was altered", 2, "failed"
    )
    assert check_link(head, "r1", "failed", failed_link(3, head.hash)) == Broken(
        "sequence gap: expected seq 2, found 3", 3, "failed"
    )
    assert check_link(head, "r1", "failed", failed_link(2, "2" * 64)) == Broken(
        "prev_hash 222222222222… does not match the hash of seq 1", 2, "failed"
    )
    linked = check_link(head, "r1", "failed", failed_link(2, head.hash))
    expected = Failed(run_id="r1", seq=2, prev_hash=head.hash, reason="preempted")
    assert linked == Linked(expected, seal(encode_event(expected), head.hash)[1])


def test_a_hash_member_that_is_not_ascii_is_a_mismatch_not_a_crash() -> None:
    body = encode_event(Failed(run_id="r1", seq=1, prev_hash=GENESIS, reason="preempted"))
    forged = body[:-1] + b',"hash":"' + "é".encode() + b"a" * 62 + b'"}'
    assert unseal(forged) == (body, "\ufffd\ufffd" + "a" * 62, None)
    assert check_link(ChainHead(), "r1", "failed", forged) == Broken(
        "hash mismatch: the payload was altered", 1, "failed"
    )


# -- anchor notes ---------------------------------------------------------------------------------------------


def vector_anchors() -> list[Anchor]:
    """The format 2 notes of `anchors.json`, built field by field (`prev_hash` from the vectors)."""
    created, config = "2026-01-01 11:59:00.123456+00:00", {"deny_delete": "True", "max_age": "0.0"}
    return [
        Anchor(stream="FTRAIN_EVENTS", created=created, config=config, stream_seq=4, run_id=RUN, seq=4,
               head_hash=EVENTS[3]["hash"], time=T.replace(hour=14)),
        Anchor(stream="FTRAIN_EVENTS", created=created, config=config, stream_seq=6, root=ROOT,
               time=T.replace(hour=17), note="audit"),
    ]  # fmt: skip


def members(line: str) -> list[tuple[str, Any]]:
    """Every member of a line's object, in order, as a plain JSON parser sees it (duplicates kept)."""
    pairs: list[tuple[str, Any]] = json.loads(line, object_pairs_hook=list)
    return pairs


def test_each_anchor_line_hashes_and_verifies_with_nothing_but_hashlib_and_ed25519() -> None:
    """Both formats: strip the trailing `hash`, `signer`, `sig` members, hash with the line before's hash,
    check the signature over `ftrain-anchor-v1:` ‖ hash."""
    public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(ANCHORS["public_key"]))
    prev = GENESIS
    assert [v["format"] for v in ANCHORS["lines"]] == [1, 1, 2, 2]  # a file may mix them
    for vector in ANCHORS["lines"]:
        verified_body(vector["line"].encode(), vector, prev, public, b"ftrain-anchor-v1:")
        prev = vector["hash"]


def verified_body(
    sealed: bytes, vector: dict[str, str], prev: str, public: Ed25519PublicKey, domain: bytes
) -> bytes:
    """The body of a signed vector, checked as the README tells a verifier: the trailing `hash`, `signer`,
    `sig` members stripped, SHA-256 over the previous hash and the body, the signature over `domain` ‖ hash."""
    trailer = f',"hash":"{vector["hash"]}","signer":"{vector["signer"]}","sig":"{vector["sig"]}"}}'.encode()
    assert sealed.endswith(trailer) and vector["prev_hash"] == prev
    body = sealed[: -len(trailer)] + b"}"
    assert hashlib.sha256(prev.encode() + body).hexdigest() == vector["hash"]
    public.verify(bytes.fromhex(vector["sig"]), domain + vector["hash"].encode())
    return body


def test_a_plain_json_parser_sees_every_member_of_a_format_2_line_once() -> None:
    """Format 2 names the run head `head_hash`: `json.loads` and `jq` see it. Format 1 named it `hash`, a name
    the seal repeats, so they kept only the seal's."""
    for vector in ANCHORS["lines"]:
        pairs = members(vector["line"])
        names = [name for name, _ in pairs]
        seal = dict(pairs[-3:])
        assert (seal["hash"], seal["signer"], seal["sig"]) == (
            vector["hash"],
            vector["signer"],
            vector["sig"],
        )
        if vector["format"] == 2:
            assert len(names) == len(set(names)) and names[0] == "format" and pairs[0][1] == 2
            assert dict(pairs)["head_hash"] == vector["head_hash"] and "hash" not in dict(pairs[:-3])
        else:
            assert names.count("hash") == 2 and "format" not in names and "head_hash" not in names
            assert dict(pairs[:-3])["hash"] == vector["head_hash"]


def test_a_file_mixing_both_formats_reads_each_run_head_and_verifies_as_one_chain() -> None:
    lines = [v["line"].encode() for v in ANCHORS["lines"]]
    notes, problems = chain_of(lines, TrustList({ANCHORS["public_key"]: "vector-writer"}))
    assert problems == [] and len(notes) == len(lines)
    for note, vector in zip(notes, ANCHORS["lines"], strict=True):
        assert (note.anchor.format, note.anchor.head_hash, note.hash) == (
            vector["format"], vector["head_hash"], vector["hash"],
        )  # fmt: skip
    assert notes[1].anchor.head_hash == EVENTS[1]["hash"]  # format 1's head, never the seal's hash
    assert chain_of(lines, TrustList())[0] == []  # no trusted key: nothing counts


def test_sealing_the_vector_notes_with_the_vector_key_reproduces_format_2_byte_for_byte() -> None:
    signer = Signer(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(SIGNING_SEED)))
    written = [v for v in ANCHORS["lines"] if v["format"] == 2]
    for anchor, vector in zip(vector_anchors(), written, strict=True):
        stamped = msgspec.structs.replace(anchor, prev_hash=vector["prev_hash"])
        assert anchor_line(stamped, signer) == ((vector["line"] + "\n").encode(), vector["hash"])
        read = read_line(vector["line"].encode())
        assert read is not None and read.anchor == stamped


def test_every_note_ftrain_writes_has_unique_member_names() -> None:
    """Whatever it holds: a run head, an audit root, a stream note."""
    signer = Signer(Ed25519PrivateKey.generate())
    for anchor in [
        *vector_anchors(),
        Anchor(stream="S", created="c", config={}, stream_seq=0, note="first seen"),
    ]:
        names = [name for name, _ in members(anchor_line(anchor, signer)[0].decode())]
        assert len(names) == len(set(names)), names


# -- the checkpoint: manifest, marker, digests ---------------------------------------------------------------


def vector_manifest() -> Manifest:
    data = (CHECKPOINT / "state.json").read_bytes()
    return Manifest(run_id=RUN, step=100, epoch=1, shards=1, world_size=16, dataset_revision="v1", created_at=T,
                    files=(FileEntry("state.json", len(data), digest_of(data)),))  # fmt: skip


def test_each_checkpoint_file_has_its_vector_digest() -> None:
    for name in ("state.json", "manifest.json", ".complete"):
        raw = (CHECKPOINT / name).read_bytes()
        assert DIGESTS[name] == "sha256:" + hashlib.sha256(raw).hexdigest() == digest_of(raw), name
    assert (
        DIGESTS["checkpoint_hash"]
        == to_hex(Digest(DIGESTS["manifest.json"]))
        == hashlib.sha256((CHECKPOINT / "manifest.json").read_bytes()).hexdigest()
    )


def test_the_format_2_vector_manifest_reads_and_writes_byte_for_byte_and_new_ones_are_format_3() -> None:
    raw = (CHECKPOINT / "manifest.json").read_bytes()
    format_2 = msgspec.structs.replace(vector_manifest(), format=2)
    assert encode_manifest(format_2) == raw
    assert decode_manifest(raw) == format_2
    assert msgspec.json.decode(raw)["format"] == 2
    assert FORMAT == 3 and msgspec.json.decode(encode_manifest(vector_manifest()))["format"] == 3


def test_the_manifest_lists_its_files_in_name_order_whatever_order_they_came_in() -> None:
    entries = tuple(FileEntry(name, 1, digest_of(name.encode())) for name in ("b", "c", "a"))
    manifest = msgspec.structs.replace(vector_manifest(), files=entries)
    listed = msgspec.json.decode(encode_manifest(manifest))["files"]
    assert [f["name"] for f in listed] == ["a", "b", "c"]
    assert manifest.size_bytes == 3


def test_the_marker_names_the_manifest_digest_and_step_byte_for_byte() -> None:
    raw = (CHECKPOINT / ".complete").read_bytes()
    marker = Marker(Digest(DIGESTS["manifest.json"]), 100)
    assert msgspec.json.encode(marker) == raw
    assert decode_marker(raw) == marker


def test_a_format_1_marker_reads_as_format_2() -> None:
    raw = b'{"manifest_sha256":"' + CHECKPOINT_HASH.encode() + b'","step":100}'
    assert decode_marker(raw) == Marker(from_hex(CHECKPOINT_HASH), 100)


def test_a_format_1_manifest_reads_with_its_digests_in_format_2s_form() -> None:
    old = msgspec.json.decode((CHECKPOINT / "manifest.json").read_bytes(), type=dict[str, Any])
    old["format"] = 1
    old["files"] = [{"name": "state.json", "size": 12, "sha256": to_hex(Digest(DIGESTS["state.json"]))}]
    manifest = decode_manifest(msgspec.json.encode(old))
    assert manifest == msgspec.structs.replace(vector_manifest(), format=1)


def test_a_manifest_written_before_blake3_reads_each_file_as_sha256_in_either_format() -> None:
    raw = (CHECKPOINT / "manifest.json").read_bytes()
    assert [f.algorithm for f in decode_manifest(raw).files] == ["sha256"]
    old = msgspec.json.decode(raw, type=dict[str, Any])
    old["format"] = 1
    old["files"] = [{"name": "state.json", "size": 12, "sha256": to_hex(Digest(DIGESTS["state.json"]))}]
    assert [f.algorithm for f in decode_manifest(msgspec.json.encode(old)).files] == ["sha256"]


def test_a_blake3_file_entry_round_trips_while_the_marker_stays_sha256() -> None:
    data = (CHECKPOINT / "state.json").read_bytes()
    entry = FileEntry("state.json", len(data), digest_of(data, "blake3"))
    manifest = msgspec.structs.replace(vector_manifest(), files=(entry,))
    raw = encode_manifest(manifest)
    assert decode_manifest(raw) == manifest and msgspec.json.decode(raw)["format"] == FORMAT
    assert msgspec.json.decode(raw)["files"][0]["digest"] == "blake3:" + blake3.blake3(data).hexdigest()
    with pytest.raises(msgspec.ValidationError):  # read as neither format: its marker is unreadable
        decode_marker(msgspec.json.encode({"manifest_digest": digest_of(raw, "blake3"), "step": 100}))


@pytest.mark.parametrize(
    "digest",
    ["sha256:" + "A" * 64, "sha256:" + "a" * 63, "blake3:" + "a" * 65, "a" * 64, "MD5:" + "a" * 32, "md5:"],
)
def test_a_stored_digest_names_its_algorithm_and_a_known_ones_is_64_lowercase_hex(digest: str) -> None:
    stored = msgspec.json.decode((CHECKPOINT / "manifest.json").read_bytes())
    stored["files"][0]["digest"] = digest
    with pytest.raises(msgspec.ValidationError, match=r"matching regex .* - at `\$\.files\[0\]\.digest`"):
        decode_manifest(msgspec.json.encode(stored))


# -- subjects and run ids ------------------------------------------------------------------------------------


def test_a_record_is_filed_under_its_run_and_type() -> None:
    assert run_subject("r1", "failed") == "ftrain.run.r1.failed"
    assert run_subject("r1") == "ftrain.run.r1.*"
    assert parse_subject("ftrain.run.r1.failed") == ("r1", "failed")
    assert parse_subject("ftrain.run.a.b.failed") == (
        "a.b",
        "failed",
    )  # never a valid id: reported, not skipped
    assert parse_subject("ftrain.run.x") == ("x", "")
    assert parse_subject("ftrain.run") == ("", "")


@pytest.mark.parametrize("run_id", ["a", "0", "A-b_9", "x" * RUN_ID_MAX])
def test_a_run_id_is_a_safe_subject_token_and_directory_name(run_id: str) -> None:
    assert validate_run_id(run_id) == run_id


@pytest.mark.parametrize(
    ("run_id", "message"),
    [
        ("", "run id is empty"),
        ("x" * (RUN_ID_MAX + 1), f"run id is {RUN_ID_MAX + 1} characters long (at most {RUN_ID_MAX})"),
        ("-a", "run id '-a' is invalid: use letters, digits, '-' and '_', starting with a letter or digit"),
        ("a.b", "run id 'a.b' is invalid: use letters, digits, '-' and '_', starting with a letter or digit"),
        ("a/b", "run id 'a/b' is invalid: use letters, digits, '-' and '_', starting with a letter or digit"),
    ],
)
def test_a_run_id_that_is_unsafe_is_refused_saying_why(run_id: str, message: str) -> None:
    with pytest.raises(InvalidRunId, match=f"^{re.escape(message)}$"):
        validate_run_id(run_id)
    with pytest.raises(InvalidRunId, match=f"^{re.escape(message.replace('run id', '--run-id'))}$"):
        validate_run_id(run_id, what="--run-id")


def test_an_event_of_exactly_the_payload_limit_encodes_and_one_byte_more_is_refused_saying_its_size() -> None:
    """An event's bytes are at most MAX_EVENT_BYTES (512 KiB): half the server's payload limit."""
    empty = len(encode_event(Failed(run_id="r1", reason="preempted")))
    at_limit = Failed(run_id="r1", reason="preempted", message="a" * (MAX_EVENT_BYTES - empty))
    assert MAX_EVENT_BYTES == 524288 and len(encode_event(at_limit)) == MAX_EVENT_BYTES
    over = msgspec.structs.replace(at_limit, message=at_limit.message + "a")
    with pytest.raises(InvalidEvent, match=r"^failed event of 524289 bytes exceeds 524288$"):
        encode_event(over)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (Failed(run_id="r1", reason="preempted", exit_code=2**63),
         "failed event out of bounds: Expected `int` <= 9223372036854775807 - at `$.exit_code`"),
        (Checkpointed(run_id="r1", step=-1, epoch=0, shards=1, uri=URI, checkpoint_hash="h", size_bytes=0),
         "checkpointed event out of bounds: Expected `int` >= 0 - at `$.step`"),
        (Completed(run_id="r1", cost_gpu_hours=float("nan"), running_seconds=1.0, cost_source="reported"),
         "completed event out of bounds: Expected `float`, got `null` - at `$.cost_gpu_hours`"),
        (Failed(run_id="r1", reason="preempted", message="bad \udcff byte"),
         "failed event holds text that is not valid Unicode (surrogates not allowed)"),
    ],
)  # fmt: skip
def test_an_event_a_reader_would_refuse_is_refused_at_encode_naming_its_type_and_why(
    event: AnyEvent, message: str
) -> None:
    """Every bound is checked where bytes are made: an int64 overflow, a negative count, a NaN (it encodes as
    null), text that is not Unicode. The error is InvalidEvent (a ValueError), never msgspec's own."""
    with pytest.raises(InvalidEvent, match=f"^{re.escape(message)}$") as raised:
        encode_event(event)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_the_published_json_schema_names_every_event_type() -> None:
    schema = stored_schema()
    defs, variants = schema["$defs"], schema["anyOf"]
    assert isinstance(defs, dict) and isinstance(variants, list)
    types = ["Launched", "Checkpointed", "Snapshotted", "SnapshotReplicated", "Failed", "Resumed",
             "CorruptSkipped", "Completed"]  # fmt: skip
    parts = ["Actor", "CheckpointPolicy", "DataPosition", "SchedulerJob", "SnapshotPart", "PartReplicas"]
    assert sorted(defs) == sorted([*types, *parts])
    assert [variant["$ref"] for variant in variants] == [f"#/$defs/{name}" for name in types]


def test_events_are_stamped_in_utc() -> None:
    before = datetime.now(UTC)
    stamp = now()
    assert stamp.tzinfo is UTC and before <= stamp <= datetime.now(UTC)


@pytest.mark.parametrize(
    "text",
    [
        "a" * 64 + "\n",
        "sha256:" + "a" * 64 + "\n",
        "A" * 64,
        "sha256:" + "a" * 63,
        "blake3:" + "a" * 64 + "\n",
    ],
)
def test_a_stored_digest_is_exactly_its_form_not_one_with_a_trailing_newline(text: str) -> None:
    kind = DigestField if ":" in text else HexField
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(text, kind)

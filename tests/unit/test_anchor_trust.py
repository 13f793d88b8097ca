"""Only signed, chained anchor notes count (issue 22, finding 4): a note appended to an anchor file by someone
who can write it — unsigned, signed by a key nobody trusts, badly signed, or a copy of an older note — is
reported and ignored by every reader: the stream check of every open, `server repair`, and `audit verify`; and
a writer never chains its note onto one. Pure: real files, no server (the finding reproduced against a real
nats-server: tests/integration/test_anchor_trust.py)."""

from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from structlog.testing import capture_logs

from ftrain.events.anchor_file import AnchorFiles, read_lines
from ftrain.events.anchors import Anchor, anchor_line, read_line
from ftrain.events.chain import ChainHead, seal
from ftrain.events.record import STREAM
from ftrain.events.signing import Signer, TrustList
from ftrain.projections.log_anchors import AnchorCheck
from tests.support.builders import T0

ALICE = Signer(Ed25519PrivateKey.generate())
MALLORY = Signer(Ed25519PrivateKey.generate())
TRUST = TrustList({ALICE.public_key: "alice"})
IDENTITY = {"stream": STREAM, "created": "2026-01-01 00:00:00", "config": {"deny_delete": "True"}}


def note(stream_seq: int, **fields: object) -> Anchor:
    return Anchor(**{**IDENTITY, "stream_seq": stream_seq, "time": T0, **fields})  # type: ignore[arg-type]


def last_hash(path: Path) -> str:
    last = read_line(read_lines(path)[-1])
    assert last is not None
    return last.hash


def forged_line(path: Path, anchor: Anchor, signer: Signer | None = None, *, bad_sig: bool = False) -> bytes:
    """A note chained after `path`'s last line, as someone who can write the file would append it."""
    chained = msgspec.structs.replace(anchor, prev_hash=last_hash(path))
    if signer is None:
        return seal(msgspec.json.encode(chained), chained.prev_hash)[0] + b"\n"
    line, _ = anchor_line(chained, signer)
    if bad_sig:
        line = line[: -len('"}\n') - 128] + b"0" * 128 + b'"}\n'
    return line


def append(path: Path, line: bytes) -> int:
    """Append `line`; returns the byte offset it starts at."""
    with path.open("ab") as f:
        f.write(line)
        return f.tell() - len(line)


@pytest.fixture
def files(tmp_path: Path) -> AnchorFiles:
    """A home file and a mirror, each holding two notes alice wrote."""
    anchors = AnchorFiles([tmp_path / "home" / "a.log", tmp_path / "mirror" / "a.log"], ALICE, TRUST)
    anchors.append([note(n, run_id="r", seq=n, head_hash=f"{n}" * 64) for n in (1, 2)])
    anchors.close()
    return anchors


@pytest.mark.parametrize(
    ("signer", "bad_sig", "why"),
    [
        (None, False, "unsigned"),
        (MALLORY, False, "signed by untrusted key"),
        (ALICE, True, "its signature does not verify"),
    ],
    ids=["unsigned", "untrusted", "bad-signature"],
)
def test_the_newest_note_is_the_last_trusted_one_and_a_forged_one_is_reported(
    files: AnchorFiles, signer: Signer | None, bad_sig: bool, why: str
) -> None:
    mirror = files.paths[1]
    at = append(mirror, forged_line(mirror, note(99, created="2026-06-06 06:06:06"), signer, bad_sig=bad_sig))
    with capture_logs() as logs:
        newest = files.newest()
    assert newest.anchor is not None
    assert (newest.anchor.stream_seq, newest.anchor.created) == (2, IDENTITY["created"])
    assert len(newest.ignored) == 1
    assert newest.ignored[0].startswith(f"anchor file {mirror}: the line at byte {at} is {why}")
    assert newest.ignored[0].endswith(": ignored")
    assert [e["event"] for e in logs] == ["anchor_notes_ignored"] and logs[0]["log_level"] == "warning"


def test_a_copy_of_an_older_trusted_note_appended_to_a_file_is_reported_and_ignored(
    files: AnchorFiles,
) -> None:
    mirror = files.paths[1]
    at = append(mirror, read_lines(mirror)[0] + b"\n")  # alice's own signature, replayed out of place
    newest = files.newest()
    assert newest.anchor is not None and newest.anchor.stream_seq == 2
    assert newest.ignored == [
        f"anchor file {mirror}: the line at byte {at} is a copy of an earlier note: ignored"
    ]
    check = AnchorCheck.load([mirror], TRUST, None)
    assert (check.problems, check.ignored) == (
        [], [f"anchor file {mirror}: line 3 is a copy of an earlier note: ignored"]
    )  # fmt: skip


def test_a_writer_chains_its_note_onto_the_last_trusted_one_never_onto_a_forgery(files: AnchorFiles) -> None:
    mirror = files.paths[1]
    trusted_tip = last_hash(mirror)
    append(mirror, forged_line(mirror, note(99, note="repair: nothing differed")))
    files.append([note(3, run_id="r", seq=3, head_hash="c" * 64)])
    written = read_line(read_lines(mirror)[-1])
    assert written is not None and written.anchor.prev_hash == trusted_tip
    newest = files.newest()
    assert newest.anchor is not None and newest.anchor.seq == 3  # chained past the forged line
    check = AnchorCheck.load([mirror], TRUST, None)
    assert (check.problems, check.ignored) == ([], [f"anchor file {mirror}: line 3 is unsigned: ignored"])
    assert check.accepted == []  # the forged `repair:` note is not the operator's decision
    assert check.unanchored({"r": ChainHead(3, "c" * 64, 3)}) == {}  # alice's head, not the forger's


def test_a_file_whose_every_note_is_untrusted_anchors_nothing(files: AnchorFiles) -> None:
    stranger = AnchorFiles(files.paths, MALLORY, TrustList({MALLORY.public_key: "mallory"}))
    second = len(read_lines(files.paths[0])[0]) + 1
    why = f"signed by untrusted key ed25519:{ALICE.public_key[:16]}…: ignored"
    assert stranger.newest() == (
        None,
        [f"anchor file {path}: the lines at bytes 0-{second} are {why}" for path in files.paths],
    )


def test_the_audit_reads_the_same_notes_as_the_stream_check(files: AnchorFiles) -> None:
    home = files.paths[0]
    append(home, forged_line(home, note(99, created="2026-06-06 06:06:06"), MALLORY))
    check = AnchorCheck.load([home], TRUST, None)
    assert check.newest is not None and check.newest.created == IDENTITY["created"]
    assert check.problems == []  # reported, never held against the log
    assert check.ignored == [
        f"anchor file {home}: line 3 is signed by untrusted key ed25519:{MALLORY.public_key[:16]}…: ignored"
    ]

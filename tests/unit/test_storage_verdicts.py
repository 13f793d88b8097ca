"""On real files, only absence under a listable directory or wrong bytes are corrupt: a storage root that is
gone is unavailable, never a verdict on the checkpoint (the resume against a real log:
tests/integration/test_storage_unavailable.py)."""

import errno
import hashlib
import json
from pathlib import Path

import msgspec
import pytest

from ftrain.workers.integrity import digest_of
from ftrain.workers.manifest import FileEntry, Marker, decode_manifest
from ftrain.workers.storage.file.checkpoint_dir import verify_checkpoint
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.storage.verdict import file_verdict
from tests.support.builders import write_checkpoint


def test_only_absence_under_a_listable_directory_or_wrong_bytes_are_corrupt(tmp_path: Path) -> None:
    written = write_checkpoint(
        tmp_path / "root", run_id="r", step=10, epoch=0, shards=1, sources=[("a.bin", b"abc")]
    )
    (written.path / "a.bin").unlink()
    assert verify_checkpoint(written.path, written.checkpoint_hash) == "file a.bin missing"
    written.path.rename(written.path.with_name("elsewhere"))
    assert verify_checkpoint(written.path, written.checkpoint_hash) == "directory missing"
    (tmp_path / "root").rename(tmp_path / "unmounted")
    with pytest.raises(StorageUnavailable, match="storage unavailable"):
        verify_checkpoint(written.path, written.checkpoint_hash)
    entry = FileEntry("a.bin", 3, digest_of(b"abc"))
    for code in (errno.EIO, errno.EACCES, errno.ESTALE, errno.ETIMEDOUT):
        with pytest.raises(StorageUnavailable):
            file_verdict(tmp_path, entry, OSError(code, "injected"))


def test_a_checkpoint_hashed_with_blake3_names_it_per_file_verifies_by_it_and_catches_one_flipped_byte(
    tmp_path: Path,
) -> None:
    data = bytes(range(256)) * 64
    written = write_checkpoint(
        tmp_path, run_id="r", step=10, epoch=0, shards=1, sources=[("a.bin", data)], algorithm="blake3"
    )
    (entry,) = decode_manifest((written.path / "manifest.json").read_bytes()).files
    assert (entry.algorithm, entry.digest) == ("blake3", digest_of(data, "blake3"))
    raw = (written.path / "manifest.json").read_bytes()
    assert written.checkpoint_hash == hashlib.sha256(raw).hexdigest(), "the log's hash stays SHA-256"
    assert verify_checkpoint(written.path, written.checkpoint_hash) is None
    flipped = bytearray(data)
    flipped[4097] ^= 0x01
    (written.path / "a.bin").write_bytes(bytes(flipped))
    assert verify_checkpoint(written.path, written.checkpoint_hash) == "file a.bin hash mismatch"


@pytest.mark.parametrize(
    ("digest", "named"),
    [("md5:" + "a" * 32, "md5"), ("sha512:" + "b" * 128, "sha512"), ("xxh3:" + "c" * 16, "xxh3")],
)
def test_a_manifest_naming_an_algorithm_ftrain_does_not_hash_with_is_refused_saying_so(
    tmp_path: Path, digest: str, named: str
) -> None:
    """Its writer sealed it so (the marker and the log agree with the manifest): still refused, by name, never
    hashed with a guess nor passed unchecked."""
    written = write_checkpoint(tmp_path, run_id="r", step=10, epoch=0, shards=1, sources=[("a.bin", b"abc")])
    manifest = json.loads((written.path / "manifest.json").read_bytes())
    manifest["files"][0]["digest"] = digest
    raw = json.dumps(manifest).encode()
    (written.path / "manifest.json").write_bytes(raw)
    (written.path / ".complete").write_bytes(msgspec.json.encode(Marker(digest_of(raw), 10)))
    assert verify_checkpoint(written.path, hashlib.sha256(raw).hexdigest()) == (
        f"file a.bin names digest algorithm {named!r}, unknown to this ftrain (it checks sha256, blake3)"
    )

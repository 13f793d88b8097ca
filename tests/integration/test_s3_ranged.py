"""Parallel ranged downloads (`workers.storage.s3.ranged`) against two real S3 implementations, SeaweedFS and moto: the
digest of a file fetched in many ranges is the digest of its bytes; an object longer or shorter than its
manifest entry, a flipped byte and a missing object are verdicts; a store killed mid-download is
StorageUnavailable, never corruption."""

import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ftrain.workers.integrity import digest_of
from ftrain.workers.manifest import FileEntry
from ftrain.workers.storage.s3.ranged import Ranges, fetch_file, fetch_files
from ftrain.workers.storage.storage_errors import StorageUnavailable
from tests.support.s3 import S3_KINDS, Endpoint, endpoint

KINDS = list(S3_KINDS)
MIB = 1 << 20
SMALL = Ranges(size=MIB, threads=3, window=4)
"""1 MiB ranges, 3 in flight, 4 held per file: a few MiB make many ranges."""


@pytest.fixture
def bucket(s3: Endpoint) -> str:
    return s3.new_bucket()


def put(s3: Endpoint, bucket: str, name: str, data: bytes) -> FileEntry:
    """Store `data` as `step/<name>`; its manifest entry."""
    s3.client().put_object(Bucket=bucket, Key=f"step/{name}", Body=data)
    return FileEntry(name, len(data), digest_of(data))


def fetch(s3: Endpoint, bucket: str, files: list[FileEntry], into: Path) -> str | None:
    return fetch_files(s3.client(), bucket, "step/", files, into, SMALL)


def test_files_in_many_ranges_arrive_whole_private_and_with_their_digest(
    s3: Endpoint, bucket: str, tmp_path: Path
) -> None:
    sizes = {"odd": 5 * MIB + 123, "exact": 3 * MIB, "one": 1000, "empty": 0}
    data = {name: os.urandom(size) for name, size in sizes.items()}
    files = [put(s3, bucket, name, blob) for name, blob in data.items()]
    assert fetch(s3, bucket, files, tmp_path) is None
    for name, blob in data.items():
        assert (tmp_path / name).read_bytes() == blob
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


def test_an_object_shorter_than_its_entry_is_a_verdict(s3: Endpoint, bucket: str, tmp_path: Path) -> None:
    entry = put(s3, bucket, "__0_0.distcp", os.urandom(5 * MIB))
    stored = int(2.5 * MIB)
    put(s3, bucket, entry.name, os.urandom(stored))  # ranges past its end answer 416, the others its size
    assert (
        fetch(s3, bucket, [entry], tmp_path)
        == f"file __0_0.distcp is {stored} bytes, manifest says {5 * MIB}"
    )


def test_an_object_longer_than_its_entry_is_refused_before_it_fills_a_disk(
    s3: Endpoint, bucket: str, tmp_path: Path
) -> None:
    entry = put(s3, bucket, "__1_0.distcp", os.urandom(3 * MIB))
    put(s3, bucket, entry.name, os.urandom(64 * MIB))
    assert (
        fetch(s3, bucket, [entry], tmp_path)
        == f"file __1_0.distcp is {64 * MIB} bytes, manifest says {3 * MIB}"
    )
    assert (tmp_path / entry.name).stat().st_size <= entry.size
    empty = FileEntry("empty", 0, digest_of(b""))
    put(s3, bucket, "empty", b"x")
    assert fetch(s3, bucket, [empty], tmp_path) == "file empty is 1 bytes, manifest says 0"


def test_a_flipped_byte_and_a_missing_object_are_verdicts(s3: Endpoint, bucket: str, tmp_path: Path) -> None:
    data = bytearray(os.urandom(4 * MIB + 7))
    entry = put(s3, bucket, "__0_0.distcp", bytes(data))
    data[3 * MIB + 1] ^= 0x01
    put(s3, bucket, entry.name, bytes(data))
    assert fetch(s3, bucket, [entry], tmp_path) == "file __0_0.distcp hash mismatch"
    gone = FileEntry("gone", 10, entry.digest)
    assert fetch(s3, bucket, [gone], tmp_path) == "file gone missing"
    assert fetch(s3, bucket, [FileEntry("..", 1, entry.digest)], tmp_path) == "file name '..' is not allowed"


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_killed_mid_download_is_unavailable_never_corruption(kind: str, tmp_path: Path) -> None:
    slow = Ranges(size=128 << 10, threads=1, window=1)  # 512 ranges one after another: time to kill the store
    target = tmp_path / "into" / "__0_0.distcp"
    target.parent.mkdir()
    outcome: list[object] = []
    with endpoint(kind, tmp_path / kind) as s3:
        bucket = s3.new_bucket()
        entry = put(s3, bucket, target.name, os.urandom(64 * MIB))

        def download() -> None:
            with ThreadPoolExecutor(1) as pool:
                try:
                    outcome.append(
                        fetch_file(s3.client(), bucket, f"step/{target.name}", entry, target, pool, slow)
                    )
                except StorageUnavailable as exc:
                    outcome.append(exc)

        worker = threading.Thread(target=download)
        worker.start()
        deadline = time.monotonic() + 30
        while not (target.exists() and target.stat().st_size > MIB) and time.monotonic() < deadline:
            time.sleep(0.01)
    # leaving the block killed the store, one MiB into the download
    worker.join(60)
    assert not worker.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], StorageUnavailable), outcome
    assert str(outcome[0]).startswith(f"storage unavailable: s3://{bucket}/step/__0_0.distcp: ")

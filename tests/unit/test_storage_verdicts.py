"""On real files, only absence under a listable directory or wrong bytes are corrupt: a storage root that is
gone is unavailable, never a verdict on the checkpoint (the resume against a real log:
tests/integration/test_storage_unavailable.py)."""

import errno
from pathlib import Path

import pytest

from ftrain.workers.integrity import digest_of
from ftrain.workers.manifest import FileEntry
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

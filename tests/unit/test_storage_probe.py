"""What a file system's refusal of the start-up probe means: a location that is wrong answers the same next
time (StorageError, never retried), storage out of reach may come back (StorageUnavailable). The probe itself
on every backend: tests/integration/test_storage_conformance.py; in `load()`: tests/integration/test_start_up.py."""

import errno
import os
from pathlib import Path

import pytest

from ftrain.workers.layout import assembly_writer, parse_set_aside, parse_step, probe_name
from ftrain.workers.storage.file.probe_dir import probe_verdict
from ftrain.workers.storage.storage_errors import StorageError, StorageUnavailable


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ELOOP])
def test_a_location_that_cannot_be_ours_is_wrong(code: int) -> None:
    verdict = probe_verdict("file:///x/run", OSError(code, os.strerror(code)))
    assert isinstance(verdict, StorageError)
    assert str(verdict) == f"checkpoint location file:///x/run cannot be written: {os.strerror(code)}"


@pytest.mark.parametrize(
    "code", [errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR]
)
def test_storage_out_of_reach_is_unavailable(code: int) -> None:
    verdict = probe_verdict("file:///x/run", OSError(code, os.strerror(code)))
    assert isinstance(verdict, StorageUnavailable)
    assert str(verdict) == f"storage unavailable: file:///x/run: {os.strerror(code)}"


def test_the_probe_is_a_hidden_name_no_listing_of_steps_takes_for_one_of_its_own() -> None:
    name = probe_name("3f2a")
    assert name == ".probe-3f2a"
    assert (parse_step(name), parse_set_aside(name)) == (None, None)
    assert assembly_writer(Path("/r") / name) is None

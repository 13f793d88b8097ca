"""Async-save staging directories are private: created 0700, and refused when another user could redirect
them (a planted link, another user's directory, one others may write to), against real files and a second
uid."""

import os
import stat
from pathlib import Path

import pytest

from ftrain.workers.stage_dir import (
    UnsafeDirectory,
    claim_dir,
    default_stage_dir,
    safe_stage_dir,
    same_device,
)

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_staging_directory_is_created_0700_with_its_parents(tmp_path: Path) -> None:
    stage = tmp_path / "a" / "b" / "job"
    assert safe_stage_dir(stage) == stage
    assert (mode(tmp_path / "a"), mode(tmp_path / "a" / "b"), mode(stage)) == (0o700, 0o700, 0o700)
    assert safe_stage_dir(stage) == stage, "an existing private directory is reused"
    default = default_stage_dir("123")
    assert (default.name, default.parent.name) == ("123", f"ftrain-{os.getuid()}")


def test_a_planted_link_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "rank-0").mkdir(parents=True)
    (victim / "rank-0" / "precious").write_bytes(b"keep")
    (tmp_path / "stage").symlink_to(victim)
    with pytest.raises(UnsafeDirectory, match=r"stage is a symbolic link; refusing to follow it$"):
        safe_stage_dir(tmp_path / "stage")
    assert (victim / "rank-0" / "precious").read_bytes() == b"keep"


def test_another_users_or_a_shared_writable_directory_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(
        UnsafeDirectory, match=rf"is owned by uid {NOBODY}, not this user \(uid {os.getuid()}\)"
    ):
        safe_stage_dir(theirs)
    with pytest.raises(UnsafeDirectory, match=r"\(above the staging directory\) is owned by uid 65534"):
        safe_stage_dir(theirs / "job")  # their directory above ours: they could swap ours for a link
    assert not (theirs / "job").exists(), "nothing is created below a directory that is refused"

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match=r"shared is writable by group or others \(mode 777\)"):
        safe_stage_dir(shared)
    with pytest.raises(UnsafeDirectory, match=r"\(above the staging directory\) is writable by group"):
        safe_stage_dir(shared / "job")
    shared.chmod(0o1777)  # sticky, like /tmp: others cannot move our entry
    assert mode(safe_stage_dir(shared / "job")) == 0o700


def test_a_shared_cache_is_made_by_exactly_one_of_the_processes_that_claim_it(tmp_path: Path) -> None:
    assert claim_dir(tmp_path, "download-x") is True
    assert mode(tmp_path / "download-x") == 0o700
    assert claim_dir(tmp_path, "download-x") is False, "a sibling finds it made, and leaves its removal"
    (tmp_path / "download-y").symlink_to(tmp_path / "download-x")
    with pytest.raises(UnsafeDirectory, match=r"download-y is a symbolic link; refusing to follow it$"):
        claim_dir(tmp_path, "download-y")
    (tmp_path / "download-z").mkdir(mode=0o700)
    os.chmod(tmp_path / "download-z", 0o770)
    with pytest.raises(UnsafeDirectory, match=r"writable by group or others"):
        claim_dir(tmp_path, "download-z")


def test_same_device_tells_a_staged_copy_on_the_checkpoints_disk_from_one_on_another(tmp_path: Path) -> None:
    stage = safe_stage_dir(tmp_path / "stage")
    assert same_device(stage, tmp_path / "ckpt" / "run" / "not-yet")  # judged by its nearest existing parent
    shm = Path("/dev/shm")
    if shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev:
        assert not same_device(stage, shm / "ckpt")

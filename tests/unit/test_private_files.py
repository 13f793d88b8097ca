"""Everything ftrain creates is private to its user: 0700 directories, 0600 files, whatever the umask; and a
user's own storage root is left as the user made it (its SQLite files and a real CLI session:
tests/integration/test_private_files.py)."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftrain.host.atomic_file import write_atomic
from ftrain.host.private_files import private_dir
from ftrain.workers.storage.file.fence_file import claim
from tests.support.builders import write_checkpoint


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """Umask 000 for the test (the loosest a user could have), restored after."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_atomic_writes_are_0600_unless_told(tmp_path: Path, open_umask: None) -> None:
    write_atomic(tmp_path / "a", b"x")
    write_atomic(tmp_path / "b", b"x", mode=0o644)
    assert (mode(tmp_path / "a"), mode(tmp_path / "b")) == (0o600, 0o644)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temp file left behind


def test_private_dirs_are_made_0700_and_tightened_only_when_ours(tmp_path: Path, open_umask: None) -> None:
    private_dir(tmp_path / "a" / "b" / "c")
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    (tmp_path / "loose").mkdir(mode=0o755)
    private_dir(tmp_path / "loose", tighten=False)
    assert mode(tmp_path / "loose") == 0o755
    private_dir(tmp_path / "loose")
    assert mode(tmp_path / "loose") == 0o700


def test_checkpoint_directories_and_files_ftrain_writes_are_private(tmp_path: Path, open_umask: None) -> None:
    users_root = tmp_path / "shared"
    users_root.mkdir(mode=0o755)  # the user's: left alone
    claim(users_root / "r1", 1)
    written = write_checkpoint(
        users_root,
        run_id="r1",
        step=10,
        epoch=0,
        shards=1,
        sources=[("state.json", b"{}"), ("sub/x.bin", b"1")],
    )
    assert mode(users_root) == 0o755
    made = [users_root / "r1", *sorted((users_root / "r1").rglob("*"))]
    # the run dir, its .attempt, the step dir, its sub/, two data files, the manifest and the marker
    assert written.path in made and len(made) == 8
    for path in made:
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path
    fresh = tmp_path / "new" / "root"  # a root ftrain had to create is its own
    write_checkpoint(fresh, run_id="r2", step=1, epoch=0, shards=1, sources=[("state.json", b"{}")])
    assert mode(tmp_path / "new") == mode(fresh) == 0o700

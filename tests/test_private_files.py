"""Everything ftrain creates is private to its user: 0700 directories, 0600 files, whatever the umask; and a
user's own storage root is left as the user made it."""

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftrain.events.atomic_file import write_atomic
from ftrain.events.private import UnsafeDirectory, private_dir
from ftrain.projections.readmodel import ReadModel
from ftrain.workers.checkpoint_dir import write_checkpoint
from ftrain.workers.fence import claim
from ftrain.workers.outbox import Outbox


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


async def test_the_outbox_and_the_read_model_are_private_with_their_wal(
    tmp_path: Path, open_umask: None
) -> None:
    home = tmp_path / "home"  # made by the first of them, 0700 whatever the umask
    outbox = Outbox(home / "outbox.sqlite")
    model = await ReadModel.open(home / "readmodel.sqlite")
    try:
        names = {p.name: mode(p) for p in home.iterdir()}
    finally:
        outbox.close()
        await model.close()
    assert mode(home) == 0o700
    assert {"outbox.sqlite", "outbox.sqlite-wal", "readmodel.sqlite", "readmodel.sqlite-wal"} <= set(names)
    assert set(names.values()) == {0o600}, names
    loose = tmp_path / "loose"  # others could have planted a database in it: refused, never tightened
    loose.mkdir(mode=0o777)
    with pytest.raises(UnsafeDirectory, match=r"loose is writable by group or others \(mode 777\)"):
        Outbox(loose / "outbox.sqlite")
    with pytest.raises(UnsafeDirectory, match=r"loose is writable by group or others \(mode 777\)"):
        await ReadModel.open(loose / "readmodel.sqlite")
    assert (mode(loose), list(loose.iterdir())) == (0o777, [])


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


def test_a_cli_session_under_umask_000_leaves_nothing_readable_by_others(tmp_path: Path) -> None:
    env = {**os.environ, "FTRAIN_HOME": str(tmp_path / "home"), "FTRAIN_NATS_URL": "", "FTRAIN_STORAGE": ""}
    ftrain = str(Path(sys.executable).with_name("ftrain"))

    def run(*args: str) -> None:
        done = subprocess.run(
            ["sh", "-c", 'umask 000 && exec "$@"', "sh", ftrain, *args],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    try:
        run("launch", "P", "--nodes", "1", "--gpus-per-node", "2", "--run-id", "private-run")
        run("checkpoint", "private-run", "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}")
        run("status", "private-run")
    finally:
        run("server", "stop")
    home = tmp_path / "home"
    store = home / "nats" / "store"
    made = [
        home,
        *(p for p in home.rglob("*") if store not in p.parents),
    ]  # the store's inside is nats-server's
    assert store in made and home / "checkpoints" / "private-run" / "step-10" / "state.json" in made
    loose = {
        str(p.relative_to(tmp_path)): oct(mode(p))
        for p in made
        if mode(p) != (0o700 if p.is_dir() else 0o600)
    }
    assert loose == {}

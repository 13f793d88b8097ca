"""What ftrain's SQLite files and a real CLI session create is private to its user: 0700 directories, 0600
files (the WAL too), whatever the umask (atomic writes, directories and checkpoints alone:
tests/unit/test_private_files.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftrain.host.private_files import UnsafeDirectory
from ftrain.projections.readmodel import ReadModel
from ftrain.workers.outbox import Outbox
from tests.unit.test_private_files import mode
from tests.unit.test_private_files import open_umask as open_umask  # the fixture


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

"""What `load()` settles before the first step, in one process on real file systems (a tmpfs, a read-only bind
mount, /proc): a run without a log whose checkpoints were all set aside as corrupt never starts over; a
location that cannot be written, or whose run directory is a link, is refused at once; a relaunch on a disk
the dead attempt filled frees its partial step before it writes anything (the probe on every backend:
tests/integration/test_storage_conformance.py)."""

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from ftrain.train.checkpointing import CheckpointManager, NoValidCheckpoint, ResumeRefused
from ftrain.workers.layout import assemblies, complete_steps, set_asides
from tests.integration.test_training_api import _train
from tests.support.processes import ftrain_process

pytestmark = pytest.mark.timeout(300)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a file system")


@pytest.fixture
def plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script outside `ftrain run`: nothing from a supervisor, staging under the test's directory."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    for name in ("FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_CHECKPOINT_EVERY", "FTRAIN_DATASET_REVISION"):
        monkeypatch.delenv(name, raising=False)


@contextmanager
def mounted(target: Path, *options: str) -> Iterator[Path]:
    """`target` with a file system mounted on it (`mount OPTIONS… target`), unmounted on exit."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", *options, str(target)], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


def _refused_at_load(location: Path | str, message: str) -> None:
    """A manager of `location` is made, and its `load()` refuses the start with `message`."""
    manager = CheckpointManager(location, every=1)
    try:
        with pytest.raises(ResumeRefused, match=message):
            manager.load()
    finally:
        manager.close()


def _corrupt_every_step(run: Path) -> list[int]:
    """Flip one byte of each checkpoint's shard: present and wrong, as a bad disk leaves it."""
    steps = complete_steps(run)
    for step in steps:
        shard = run / f"step-{step}" / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF
        shard.write_bytes(bytes(data))
    return steps


@pytest.mark.usefixtures("plain")
def test_a_run_without_a_log_whose_checkpoints_were_all_set_aside_never_starts_over(tmp_path: Path) -> None:
    """A new user's trial: plain torchrun, no run id; every checkpoint corrupt. The first start sets them
    aside and refuses; every later start is refused too (it trained from step 0 before), until one says
    resume=False; after that the new checkpoints are the run's."""
    run = tmp_path / "ckpt" / "trial"
    assert _train(run, 10)[0] == 10
    assert _corrupt_every_step(run) == [10, 5]
    for start in ("sets them aside", "finds only what was set aside", "still refuses"):
        with pytest.raises(NoValidCheckpoint) as refused:
            _train(run, 12)
        message = str(refused.value)
        assert message.startswith(f"no valid checkpoint in {run.as_uri()}: "), (start, message)
        assert "refusing to start over" in message and "start once with resume=False" in message, message
        assert [(s.step, s.kind) for s in set_asides(run)] == [(5, "corrupt"), (10, "corrupt")], start
        assert complete_steps(run) == [], start
    assert _train(run, 12, resume=False)[0] == 12  # on purpose: from step 0
    assert complete_steps(run) == [10, 5] and len(set_asides(run)) == 2, "the evidence stays"
    assert _train(run, 15)[0] == 15 and complete_steps(run) == [15, 10, 5]


def test_a_logged_run_with_no_valid_checkpoint_says_how_to_start_over(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a run id the log says the run had checkpoints: refused at every start, and each refusal names
    what to look at and the one way to start over (a new run id; resume=False is refused for this run)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    launched = ftrain_process(
        ["launch", "proj", "--run-id", "r2", "--nodes", "1", "--gpus-per-node", "1"], env
    )
    assert launched.returncode == 0, launched.stderr
    run = Path(env["FTRAIN_STORAGE"]) / "r2"
    assert _train(run, 10, run_id="r2")[0] == 10
    assert _corrupt_every_step(run) == [10, 5]
    for found in (
        "2 checkpoint(s) found corrupt now",
        "every checkpoint was found corrupt by an earlier start",
    ):
        with pytest.raises(NoValidCheckpoint) as refused:
            _train(run, 12, run_id="r2")
        assert str(refused.value) == (
            f"no valid checkpoint in {run.as_uri()}: {found}, set aside there as step-N.corrupt-<time> (kept as "
            "evidence: inspect them there); refusing to start over. `ftrain status r2` lists what the log "
            "recorded; to train from step 0 on purpose, launch a new run id"
        )
    with pytest.raises(ResumeRefused, match=r"^run r2 has checkpoints; --no-resume needs a new --run-id$"):
        _train(run, 12, run_id="r2", resume=False)


@pytest.mark.usefixtures("plain")
def test_a_location_that_cannot_be_written_is_refused_before_the_first_step() -> None:
    _refused_at_load(
        "/proc/nope/ckpt",
        r"^checkpoint location file:///proc/nope/ckpt cannot be written: No such file or directory$",
    )


@needs_root
@pytest.mark.usefixtures("plain")
def test_a_read_only_location_is_refused_before_the_first_step(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    (root / "run").mkdir(parents=True)
    with mounted(root, "--bind", str(root)):
        subprocess.run(["mount", "-o", "remount,ro,bind", str(root)], check=True)
        _refused_at_load(
            root / "run", r"^checkpoint location \S+/ro/run cannot be written: Read-only file system$"
        )


@pytest.mark.usefixtures("plain")
def test_a_run_directory_that_is_a_link_is_refused_and_an_empty_location_too(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "run").symlink_to(elsewhere)
    _refused_at_load(tmp_path / "ckpt" / "run", r"^checkpoint location \S+/ckpt/run is a symbolic link: ")
    assert os.listdir(elsewhere) == [], "nothing written through the link"
    with pytest.raises(ValueError, match=r"^location: storage '': empty \(use a path, file:// or s3://\)$"):
        CheckpointManager("", every=1)


@needs_root
def test_a_relaunch_on_a_disk_the_dead_attempt_filled_frees_its_partial_step_first(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 saved step 5 and died writing step 10, which filled the disk; the relaunch removes the
    partial step before it claims the run (a write), resumes from step 5 and saves step 10."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    with mounted(tmp_path / "disk", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as disk:
        monkeypatch.setenv("FTRAIN_STORAGE", str(disk))
        launched = ftrain_process(
            ["launch", "proj", "--run-id", "r1", "--nodes", "1", "--gpus-per-node", "1"],
            {**env, "FTRAIN_STORAGE": str(disk)},
        )
        assert launched.returncode == 0, launched.stderr
        assert _train(disk / "r1", 5, run_id="r1")[0] == 5
        partial = disk / "r1" / ".step-10.tmp-attempt-1"
        partial.mkdir()
        _fill(partial / "__0_0.distcp")
        assert _train(disk / "r1", 10, run_id="r1")[0] == 10
        assert complete_steps(disk / "r1") == [10, 5] and assemblies(disk / "r1") == []


def _fill(path: Path) -> None:
    """Write zeros to `path` until its file system is full (as a save cut short by a full disk leaves it)."""
    with open(path, "wb", buffering=0) as f, suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
    assert os.statvfs(path.parent).f_bavail == 0, "the disk is full"


@pytest.mark.usefixtures("plain")
def test_a_superseded_start_removes_nothing_of_the_newer_attempts_partial_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 2 owns the run and is writing step 15; a start of attempt 1 (a late relaunch) is refused as
    superseded before its clean-up, which would remove attempt 2's assembly under it."""
    run = tmp_path / "ckpt" / "late"
    assert _train(run, 10)[0] == 10
    (run / ".attempt").write_text("2")
    writing = run / ".step-15.tmp-attempt-2"
    writing.mkdir()
    (writing / "__0_0.distcp").write_bytes(b"attempt 2 is writing this")
    monkeypatch.setenv("FTRAIN_ATTEMPT", "1")
    _refused_at_load(run, r"^attempt 1 is superseded by attempt 2 of late; writing nothing$")
    assert (writing / "__0_0.distcp").read_bytes() == b"attempt 2 is writing this"

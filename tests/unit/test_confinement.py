"""Checkpoint URIs are confined to the run's own directory, and nothing that prunes, quarantines or cleans up
follows a symbolic link out of it: planted links against real files (a forged event against a real log:
tests/integration/test_confinement_resume.py)."""

import hashlib
import os
from pathlib import Path

import pytest

from ftrain.workers.layout import MARKER, assembly_dir, complete_steps, process_writer, retire
from ftrain.workers.storage.file.checkpoint_dir import (
    confined,
    on_disk,
    remove_dead_assemblies,
    set_aside,
    verify_checkpoint,
)
from ftrain.workers.storage.file.retention import prune
from ftrain.workers.storage.file.run_dir import FileRun
from ftrain.workers.storage.location import path_uri, run_location
from ftrain.workers.storage.storage_errors import StorageUnavailable
from tests.support.builders import write_checkpoint

RUN = "conf-run"


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with the SHA-256 of its bytes: the victim must survive byte for byte."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def victim(root: Path, step: int = 20) -> Path:
    """A directory outside the run's storage holding a complete, self-consistent checkpoint of the run."""
    return write_checkpoint(
        root, run_id=RUN, step=step, epoch=0, shards=1, sources=[("state.json", b'{"evil":1}')]
    ).path


def test_a_uri_is_confined_to_a_directory_directly_under_the_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "storage" / RUN
    (run / "step-10").mkdir(parents=True)
    outside = victim(tmp_path / "elsewhere")
    (run / "step-20").symlink_to(outside)
    (run / "step-30").symlink_to(run / "step-10")  # even a sibling: a step must be a directory of its own
    (run / "nested").mkdir()

    assert confined(path_uri(run / "step-10"), run) == run / "step-10"
    assert confined(path_uri(run / "step-40"), run) == run / "step-40", "missing: for verification to say"
    assert confined(str(run / "step-10"), run) == run / "step-10"
    for uri in (
        path_uri(outside),
        path_uri(run / "step-20"),
        path_uri(run / "step-30"),
        path_uri(run / "nested" / "step-10"),
        f"file://{run}/../{RUN}-other/step-10",
        path_uri(run),
        "s3://bucket/step-10",
    ):
        assert confined(uri, run) is None, uri

    with pytest.raises(StorageUnavailable):
        confined(path_uri(outside), tmp_path / "unmounted" / RUN)  # out of reach is never "outside"


def test_a_manifest_of_another_run_or_step_is_refused_against_the_event(tmp_path: Path) -> None:
    written = victim(tmp_path)
    digest = hashlib.sha256((written / "manifest.json").read_bytes()).hexdigest()
    assert verify_checkpoint(written, digest, run_id=RUN, step=20) is None
    assert (
        verify_checkpoint(written, digest, run_id="other", step=20)
        == f"manifest is run {RUN} step 20, expected run other step 20"
    )
    assert verify_checkpoint(written, digest, run_id=RUN, step=30) == (
        f"manifest is run {RUN} step 20, expected run {RUN} step 30"
    )


def test_prune_set_aside_and_cleanup_never_follow_a_planted_link(tmp_path: Path) -> None:
    run = tmp_path / "storage" / RUN
    for step in (10, 20, 30, 40):
        write_checkpoint(
            tmp_path / "storage", run_id=RUN, step=step, epoch=0, shards=1, sources=[("a", b"x")]
        )
    target = victim(tmp_path / "victim", step=5)
    before = snapshot(target)
    (run / "step-5").symlink_to(target)  # older than every real one: first in line to be pruned
    dead = assembly_dir(run, 50, process_writer(os.uname().nodename, 2**22 + 1, "dead0000"))
    dead.symlink_to(target)  # a dead writer's leftovers, as far as its name says
    stale = assembly_dir(run, 60)
    stale.symlink_to(target)  # where the trainer's next save of step 60 would write

    assert complete_steps(run) == [40, 30, 20, 10], "a link is no checkpoint of the run"
    assert [d.step for d in on_disk(run)] == [40, 30, 20, 10]
    assert prune(run, retire(complete_steps(run), 2, None)) == [20, 10]
    assert remove_dead_assemblies(run) == [dead]
    FileRun(run_location(run), tmp_path / "stage").clean()  # the trainer's start-up
    moved = set_aside(run / "step-5", "corrupt", "1")  # only the link moves

    assert moved is not None and moved.is_symlink() and not (run / "step-5").exists()
    assert snapshot(target) == before and (target / MARKER).is_file()
    assert not os.path.lexists(dead) and not os.path.lexists(stale), "the links went, not their target"
    assert complete_steps(run) == [40, 30]

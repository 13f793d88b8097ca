"""The reference trainer under real torchrun jobs: SIGKILLs at any moment, corrupt checkpoints, exact resume.

One uninterrupted 30-step run gives the reference digest; every interrupted history must end bit-identical.
"""

import hashlib
import os
import pickle
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from ftrain.workers.integrity import Digest
from ftrain.workers.layout import MANIFEST, MARKER, complete_steps
from ftrain.workers.manifest import FileEntry, Marker, decode_manifest, encode_manifest
from ftrain.workers.stage_dir import same_device
from ftrain.workers.storage.file.checkpoint_dir import marker_hash, read_manifest, verify_checkpoint
from tests.support.page_cache import evict
from tests.support.training import final_digest, metrics, resumed_step, torchrun

pytestmark = pytest.mark.timeout(600)
ITERS = ("--train-iters", "30", "--save-interval", "5")
KILLED = -signal.SIGKILL
INFO = {"FTRAIN_LOG_LEVEL": "info"}  # the trainer says which async pipeline it took


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The digest of an uninterrupted 30-step run."""
    return final_digest(torchrun(tmp_path_factory.mktemp("reference") / "ckpt", *ITERS))


def valid(path: Path) -> bool:
    """A checkpoint directory that verifies against its own marker."""
    claimed = marker_hash(path)
    return claimed is not None and verify_checkpoint(path, claimed) is None


def test_sync_saves_resume_bit_identical_after_a_kill_mid_training_and_one_mid_save(
    tmp_path: Path, reference: str
) -> None:
    ckpt = tmp_path / "ckpt"
    first = torchrun(ckpt, *ITERS, kill_at="step:12")
    assert first.returncode == KILLED, first.stderr[-2000:]
    assert complete_steps(ckpt) == [10, 5] and valid(ckpt / "step-10")

    spans = []  # each resumed attempt's wall-clock span, which its restart time must fall within
    started = time.time()
    second = torchrun(ckpt, *ITERS, kill_at="write:20")
    spans.append(time.time() - started)
    assert second.returncode == KILLED and resumed_step(second) == 10
    assert (ckpt / ".step-20.tmp").is_dir(), "the kill landed inside the save"
    assert complete_steps(ckpt) == [15, 10, 5] and valid(ckpt / "step-15")

    started = time.time()
    third = torchrun(ckpt, *ITERS)
    spans.append(time.time() - started)
    assert resumed_step(third) == 15
    assert final_digest(third) == reference
    assert not (ckpt / ".step-20.tmp").exists(), "stale staging is removed at start-up"
    assert complete_steps(ckpt) == [30, 25, 20], "--keep 3"

    records = metrics(ckpt)
    restarts = [r for r in records if "train/restart_seconds" in r]
    assert [r["train/iter"] for r in restarts] == [11, 16]
    assert [r["train/lost_steps"] for r in restarts] == [2, 5]  # reached 12 (resumed at 10), 20 (at 15)
    # from the rank's start (the kernel's boot time is whole seconds: up to 1 s early) to the end of the
    # first step after the resume, which it includes
    for record, span in zip(restarts, spans, strict=True):
        assert record["train/dt"] < record["train/restart_seconds"] < span + 1
    saves = [r["train/iter"] for r in records if r.get("train/ckpt_save_seconds", 0) > 0]
    assert saves == [5, 10, 15, 20, 25, 30]


@pytest.fixture(params=["written-once", "staged-and-copied"])
def stage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """The node-local staging directory of an async save: beside the checkpoints (one device: the pipeline
    writes each byte once, straight to the checkpoint), or on another device (/dev/shm, a tmpfs: it stages
    there, then copies, verified, to the checkpoint)."""
    if request.param == "written-once":
        yield tmp_path / "stage"
        return
    shm = Path("/dev/shm")
    if not shm.is_dir() or same_device(shm, tmp_path):
        pytest.skip("no /dev/shm on a device of its own to stage on")
    path = shm / f"ftrain-test-{os.getpid()}-{tmp_path.name}"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_async_saves_resume_bit_identical_after_kills_in_every_phase_of_the_pipeline(
    tmp_path: Path, stage: Path, reference: str
) -> None:
    ckpt = tmp_path / "ckpt"
    flags = (*ITERS, "--async-ckpt", "--ckpt-stage-dir", str(stage))

    history = []
    for kill_at, resumed, complete_after in (
        ("fanout:10", None, [5]),  # copied to durable storage, not finalized: not a checkpoint
        ("finalize:20", 5, [15, 10, 5]),
        ("stage:25", 15, [20, 15, 10]),
    ):
        result = torchrun(ckpt, *flags, kill_at=kill_at, env=INFO)
        history.append(result)
        assert result.returncode == KILLED, result.stderr[-2000:]
        assert resumed_step(result) == resumed, kill_at
        assert complete_steps(ckpt) == complete_after, kill_at
        assert valid(ckpt / f"step-{complete_after[0]}"), "the previous complete checkpoint is untouched"

    last = torchrun(ckpt, *flags, env=INFO)
    assert resumed_step(last) == 20
    assert final_digest(last) == reference
    said = f'"write_once": {"false" if stage.is_relative_to("/dev/shm") else "true"}'
    assert all(said in job.stderr for job in [*history, last]), last.stderr[-2000:]
    assert not list(stage.glob("rank-*/step-*")), "staged copies are dropped once fanned out"
    records = metrics(ckpt)
    assert any("train/ckpt_stage_seconds" in r and "train/ckpt_drain_seconds" in r for r in records)


def test_corrupt_checkpoints_are_skipped_together_and_none_valid_exits_1(
    tmp_path: Path, reference: str
) -> None:
    ckpt = tmp_path / "ckpt"
    flags = (*ITERS, "--keep", "4")
    final_digest(torchrun(ckpt, *flags))
    assert complete_steps(ckpt) == [30, 25, 20, 15]

    # the last byte of the last file, so in its last chunk: rank 1 alone reads it, and it is found after DCP
    # parsed the items of the chunks before it; the verdict must still be everyone's
    flip(ckpt / "step-30" / "__1_0.distcp", at=-1)
    with (ckpt / "step-25" / "__0_0.distcp").open("r+b") as f:
        f.truncate(100)
    (ckpt / "step-20" / ".metadata").unlink()
    second = torchrun(ckpt, *flags)
    assert second.stdout.count("→ skipped") == 3
    assert "checkpoint step 30 file __1_0.distcp hash mismatch → skipped" in second.stdout
    assert "checkpoint step 25 file __0_0.distcp is 100 bytes" in second.stdout
    assert "checkpoint step 20 file .metadata missing → skipped" in second.stdout
    assert resumed_step(second) == 15
    assert final_digest(second) == reference
    assert len(list(ckpt.glob("step-*.corrupt-*"))) == 3, "skipped checkpoints are set aside, not deleted"

    steps = complete_steps(ckpt)
    (ckpt / f"step-{steps[0]}" / MARKER).unlink()
    for step in steps[1:]:
        manifest = read_manifest(ckpt / f"step-{step}", None)
        assert not isinstance(manifest, str)
        flip(ckpt / f"step-{step}" / manifest.files[-1].name)
    before = sorted(p.name for p in ckpt.iterdir())
    third = torchrun(ckpt, *flags)
    assert third.returncode != 0 and "FINAL" not in third.stdout
    assert f"no valid checkpoint in {ckpt.as_uri()}: 3 checkpoint(s) found corrupt now" in third.stderr
    assert "start once with resume=False (the reference trainer's --no-resume)" in third.stderr
    assert "RESUMED" not in third.stdout
    assert not [p for p in sorted(q.name for q in ckpt.iterdir()) if p not in before and "corrupt" not in p]

    fourth = torchrun(ckpt, *flags)  # what was set aside is the evidence: never from step 0 without a word
    assert fourth.returncode == 1 and "FINAL" not in fourth.stdout, fourth.stderr[-2000:]
    assert "every checkpoint was found corrupt by an earlier start" in fourth.stderr


def flip(path: Path, at: int | None = None) -> None:
    """Flip one byte of a file: at `at`, else in its middle; the file is then put out of the page cache, so a
    resume checks it chunk by chunk as it reads it."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0xFF
    path.write_bytes(bytes(data))
    evict(path)


def test_a_malicious_metadata_sealed_with_a_matching_manifest_is_refused_and_never_runs(
    tmp_path: Path,
) -> None:
    """An attacker who can rewrite a checkpoint and its manifest and marker (no log vouches here) plants a
    `.metadata` whose unpickling would create a file: refused as corrupt with the global named, the ranks
    fall back together, and the file is never created."""
    ckpt, marker = tmp_path / "ckpt", tmp_path / "MARKER"
    flags = ("--train-iters", "10", "--save-interval", "5")
    final_digest(torchrun(ckpt, *flags))
    forge_metadata(ckpt / "step-10", pickle.dumps(Touch(marker)))

    second = torchrun(ckpt, *flags)
    line = "checkpoint step 10 `.metadata` names posix.system, which is not allowed → skipped"
    assert line in second.stdout, second.stdout + second.stderr[-2000:]
    assert resumed_step(second) == 5
    assert not marker.exists()


class Touch:
    """A pickle whose loading would create a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return os.system, (f"touch {self.marker}",)


def forge_metadata(path: Path, data: bytes) -> None:
    """Replace `.metadata`, and reseal manifest and marker so they vouch for it."""
    (path / ".metadata").write_bytes(data)
    manifest = decode_manifest((path / MANIFEST).read_bytes())
    entry = FileEntry(".metadata", len(data), Digest(f"sha256:{hashlib.sha256(data).hexdigest()}"))
    files = tuple(entry if f.name == ".metadata" else f for f in manifest.files)
    raw = encode_manifest(msgspec.structs.replace(manifest, files=files))
    (path / MANIFEST).write_bytes(raw)
    digest = Digest(f"sha256:{hashlib.sha256(raw).hexdigest()}")
    (path / MARKER).write_bytes(msgspec.json.encode(Marker(digest, manifest.step)))


def test_a_planted_staging_link_is_refused_before_anything_is_written_or_deleted(tmp_path: Path) -> None:
    """Another user pre-creates the node-local staging name as a link to a directory of the victim's: the
    job refuses to start instead of clearing `rank-<R>` there at start-up or staging into it."""
    victim, stage = tmp_path / "victim", tmp_path / "stage"
    (victim / "rank-0").mkdir(parents=True)
    (victim / "rank-0" / "thesis.tex").write_bytes(b"years of work")
    stage.symlink_to(victim)

    job = torchrun(tmp_path / "ckpt", *ITERS, "--async-ckpt", "--ckpt-stage-dir", str(stage))

    assert job.returncode != 0 and "FINAL" not in job.stdout
    assert f"staging directory {stage} is a symbolic link" in job.stdout + job.stderr
    assert (victim / "rank-0" / "thesis.tex").read_bytes() == b"years of work"
    assert [p.name for p in victim.iterdir()] == ["rank-0"]

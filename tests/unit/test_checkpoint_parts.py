"""The pieces of the save and resume path, one at a time, on real files and without torchrun.

The torchrun tests (tests/e2e/test_training.py) show that the pieces work together; these pin down each
piece's own promise (what it writes, what it leaves, what it never touches) cheaply enough to run on every
change. The pieces only a fresh interpreter shows (fault injection, process start time):
test_checkpoint_parts_processes.py in tests/integration/.
"""

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

import ftrain.train.metrics
import ftrain.workers.dcp_writer
import ftrain.workers.durable_files
from ftrain.domain.lifecycle import apply, plan_resume
from ftrain.events.chain import ChainHead
from ftrain.examples.data import ResumableLoader, synthetic_tokens
from ftrain.experiments.inputs import set_aside_steps
from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.resume_load import owned
from ftrain.workers.dcp_writer import HashingFileSystem, HashingWriter
from ftrain.workers.integrity import DIGEST_CHUNK, Digest, Hashed, hash_file, hex_of
from ftrain.workers.layout import (
    MANIFEST,
    MARKER,
    PARTIAL,
    assembly_dir,
    assembly_writer,
    complete_steps,
    process_writer,
    retire,
    run_dir,
    set_asides,
)
from ftrain.workers.manifest import FileEntry, Manifest
from ftrain.workers.staging import StagingBuffers
from ftrain.workers.storage.file import retention
from ftrain.workers.storage.file.checkpoint_dir import (
    marker_hash,
    on_disk,
    read_manifest,
    set_aside,
    verify_checkpoint,
)
from ftrain.workers.storage.file.fanout import FanOutError, fan_out
from ftrain.workers.storage.file.retention import prune
from ftrain.workers.storage.file.run_dir import FileRun
from ftrain.workers.storage.location import run_location
from ftrain.workers.storage.port import set_aside_planned
from tests.support.builders import WrittenCheckpoint, checkpointed, launched, write_checkpoint


def tree(root: Path) -> set[str]:
    """Every file and directory under `root`, as paths relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def sha256(data: bytes) -> Digest:
    """The digest of `data` as stored, computed here independently of workers.integrity."""
    return Digest(f"sha256:{hashlib.sha256(data).hexdigest()}")


def spy_hash_file(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record the files the DCP writer hashes from disk (rather than in its write path)."""
    calls: list[Path] = []

    def spy(path: Path, algorithm: str, chunk_size: int = 0) -> Hashed:
        calls.append(Path(path))
        return hash_file(path, algorithm, chunk_size)

    monkeypatch.setattr(ftrain.workers.dcp_writer, "hash_file", spy)
    return calls


# -- HashingWriter ----------------------------------------------------------------------------------------


def model_and_optimizer_state() -> dict[str, Any]:
    """A small model and its AdamW state after one step (so the optimizer state is not empty)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize(
    "durable", [True, False], ids=["synced-hashed-while-syncing", "unsynced-hashed-as-written"]
)
def test_hashing_writer_lists_every_file_dcp_wrote_with_its_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """A durable file is fsync'd before the save returns and hashed from its cached pages meanwhile; a stage
    file is hashed as DCP writes it (there is no sync to hide a read-back behind)."""
    from_disk = spy_hash_file(monkeypatch)
    synced: list[int] = []
    read_back: list[int] = []
    real_fsync, real_hash_fd = os.fsync, ftrain.workers.durable_files.hash_fd

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    def hash_fd(fd: int, algorithm: str, chunk_size: int = 0) -> Hashed:
        read_back.append(os.fstat(fd).st_ino)
        return real_hash_fd(fd, algorithm, chunk_size)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(ftrain.workers.durable_files, "hash_fd", hash_fd)
    ckpt = tmp_path / "ckpt"
    writer = HashingWriter(ckpt, sync_files=durable)
    dcp_save(model_and_optimizer_state(), storage_writer=writer, no_dist=True)

    entries = writer.entries()
    assert [e.name for e in entries] == sorted(os.listdir(ckpt)) == [".metadata", "__0_0.distcp"]
    for entry in entries:
        assert Hashed(entry.size, entry.digest) == hash_file(ckpt / entry.name), entry.name
    written = sorted(p.stat().st_ino for p in ckpt.iterdir())
    if durable:
        assert sorted(synced) == written, "every file is synced once"
        assert sorted(read_back) == written and from_disk == [], "read back through the descriptor it wrote"
    else:
        assert synced == read_back == from_disk == [], "DCP writes sequentially: nothing is read back"


def test_a_stream_that_was_seeked_is_hashed_from_disk_and_renames_follow_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seek makes the running hash wrong (bytes were overwritten), so the file is hashed once closed."""
    from_disk = spy_hash_file(monkeypatch)
    fs = HashingFileSystem(durable=False)
    seq, seeked = tmp_path / "seq.bin", tmp_path / "seeked.bin"
    with fs.create_stream(seq, "wb") as stream:
        stream.write(b"hello ")
        stream.write(bytearray(b"world"))
    with fs.create_stream(seeked, "wb") as stream:
        stream.write(b"x" * 1000)
        stream.seek(10)
        stream.write(b"Y")

    assert fs.written[seq] == Hashed(11, sha256(b"hello world"), DIGEST_CHUNK, (hex_of(b"hello world"),))
    expected = b"x" * 10 + b"Y" + b"x" * 989
    assert seeked.read_bytes() == expected
    assert fs.written[seeked] == Hashed(1000, sha256(expected), DIGEST_CHUNK, (hex_of(expected),))
    assert from_disk == [seeked]

    fs.rename(seeked, tmp_path / "final.bin")
    assert set(fs.written) == {seq, tmp_path / "final.bin"}


# -- fan-out ----------------------------------------------------------------------------------------------

STAGED = {
    ".metadata": b"metadata" * 50,
    "__0_0.distcp": os.urandom(300_000),
    "__1_0.distcp": os.urandom(5_000),
}


def stage_files(stage: Path) -> list[FileEntry]:
    """Write `STAGED` under `stage` and describe them as the writer would have (size and digest)."""
    stage.mkdir(parents=True)
    for name, data in STAGED.items():
        (stage / name).write_bytes(data)
    return [FileEntry(name, len(data), sha256(data)) for name, data in STAGED.items()]


def test_fan_out_delivers_every_file_under_its_name_and_drops_the_staged_copies(tmp_path: Path) -> None:
    stage, dst = tmp_path / "stage", tmp_path / "ckpt" / ".step-5.tmp"
    entries = stage_files(stage)
    dst.mkdir(parents=True)
    (dst / f"__0_0.distcp{PARTIAL}").write_bytes(b"left by a copy that was killed")

    fan_out(stage, dst, entries)

    assert sorted(os.listdir(dst)) == sorted(STAGED)
    assert all((dst / name).read_bytes() == data for name, data in STAGED.items())
    assert os.listdir(stage) == []


def test_fan_out_refuses_a_staged_file_that_changed_after_it_was_hashed(tmp_path: Path) -> None:
    stage, dst = tmp_path / "stage", tmp_path / "ckpt" / ".step-5.tmp"
    entries = stage_files(stage)
    changed = stage / "__0_0.distcp"
    data = bytearray(changed.read_bytes())
    data[1234] ^= 0xFF  # same size: only the hash can tell
    changed.write_bytes(bytes(data))

    with pytest.raises(FanOutError, match=r"__0_0\.distcp"):
        fan_out(stage, dst, entries)

    assert not (dst / "__0_0.distcp").exists(), "a bad copy never appears under the real name"
    assert not list(dst.glob(f"*{PARTIAL}"))
    assert sorted(os.listdir(stage)) == sorted(STAGED), "staged copies stay until every file arrived"


# -- manifest formats -------------------------------------------------------------------------------------

RUN = "run-1"


def sealed(root: Path, step: int) -> WrittenCheckpoint:
    """A real checkpoint of RUN at `step`, written and sealed the way `ftrain checkpoint` does."""
    state = f'{{"step":{step}}}'.encode()
    return write_checkpoint(root, run_id=RUN, step=step, epoch=0, shards=1, sources=[("state.json", state)])


def test_a_checkpoint_is_written_in_format_3_and_the_log_still_gets_the_bare_hex_hash(tmp_path: Path) -> None:
    """Stored digests name their algorithm; a file put whole lists no chunks (its entry reads as format 2's);
    the `checkpointed` event keeps the 64-hex form its consumers read."""
    written = sealed(tmp_path, 10)
    raw = (written.path / MANIFEST).read_bytes()
    stored = msgspec.json.decode(raw)
    marker = msgspec.json.decode((written.path / MARKER).read_bytes())

    assert stored["format"] == 3
    assert stored["files"] == [{"name": "state.json", "size": 11, "digest": sha256(b'{"step":10}')}]
    assert marker == {"manifest_digest": sha256(raw), "step": 10}
    assert written.checkpoint_hash == hashlib.sha256(raw).hexdigest() == marker_hash(written.path)
    assert verify_checkpoint(written.path, written.checkpoint_hash) is None


FORMAT_1_DATA = b'{"step":10}'
FORMAT_1_MANIFEST = (
    b'{"format":1,"run_id":"old-run","step":10,"epoch":1,"shards":1,"world_size":1,"dataset_revision":null,'
    b'"created_at":"2025-06-01T12:00:00Z","files":[{"name":"state.json","size":11,'
    b'"sha256":"e480084f1920a277771bdd38f16b8e4b603f632c58f4ef56dbcb94a37ffada2c"}],"extra":{}}'
)
FORMAT_1_HASH = "b5ab1bbcfe389cd9de876134911b2acbf8016a1beb23fe17c495655f78e3119b"
FORMAT_1_MARKER = b'{"manifest_sha256":"' + FORMAT_1_HASH.encode() + b'","step":10}'


def test_a_format_1_checkpoint_already_on_disk_still_reads_and_verifies(tmp_path: Path) -> None:
    old = tmp_path / "old-run" / "step-10"
    old.mkdir(parents=True)
    (old / "state.json").write_bytes(FORMAT_1_DATA)
    (old / MANIFEST).write_bytes(FORMAT_1_MANIFEST)
    (old / MARKER).write_bytes(FORMAT_1_MARKER)

    manifest = read_manifest(old, FORMAT_1_HASH)
    assert isinstance(manifest, Manifest), manifest
    assert (manifest.format, manifest.step, manifest.epoch) == (1, 10, 1)
    assert manifest.files == (FileEntry("state.json", 11, sha256(FORMAT_1_DATA)),)
    assert marker_hash(old) == FORMAT_1_HASH
    assert verify_checkpoint(old, FORMAT_1_HASH) is None
    assert read_manifest(old, None) == manifest, "with the log out of reach, the format-1 marker vouches"

    assert verify_checkpoint(old, "0" * 64) == "hash mismatch"
    (old / "state.json").write_bytes(b'{"step":11}')
    assert verify_checkpoint(old, FORMAT_1_HASH) == "file state.json hash mismatch"


# -- retention --------------------------------------------------------------------------------------------


def make_checkpoint_dir(path: Path, *, marker: bool = True) -> Path:
    """A checkpoint-shaped directory: a shard, a manifest and (unless told otherwise) the marker."""
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    (path / MANIFEST).write_bytes(b"{}")
    if marker:
        (path / MARKER).write_bytes(b"{}")
    return path


def test_prune_keeps_the_newest_complete_checkpoints_and_never_touches_anything_else(
    tmp_path: Path,
) -> None:
    """Everything but plain `step-N` with a marker is evidence or work in progress: not counted, not deleted
    (the newer ones would push real checkpoints out of the K if they were counted)."""
    run = tmp_path / "run"
    for step in (10, 20, 30, 40):
        make_checkpoint_dir(run / f"step-{step}")
    others = ["step-50.corrupt-1", "step-60.superseded-2", ".step-70.tmp", "step-5.corrupt-3", "step-1x"]
    for name in others:
        make_checkpoint_dir(run / name)  # with a marker: only the name says what they are
    make_checkpoint_dir(run / "step-80", marker=False)
    make_checkpoint_dir(run / "step-1", marker=False)
    untouched = {p for p in tree(run) if not p.startswith(("step-10", "step-20"))}

    assert prune(run, retire(complete_steps(run), 2, None)) == [20, 10]
    assert tree(run) == untouched
    assert complete_steps(run) == [40, 30]
    assert prune(run, retire(complete_steps(run), 2, None)) == []


def test_retention_counts_and_retires_only_the_steps_the_log_accepted() -> None:
    """Sealed 40 (unrecorded: an older attempt's, refused by the log), 30, 20, 10, 5: with keep=2 the log's
    newest two (30, 20) stay, the older ones go, and 40 is neither counted nor retired; without a log every
    sealed step counts, as the listing says."""
    sealed = [40, 30, 20, 10, 5]
    assert retire(sealed, 2, {30, 20, 10, 5}) == [10, 5]
    assert retire(sealed, 2, set()) == [], "nothing the log accepted: nothing to retire"
    assert retire(sealed, 2, None) == [20, 10, 5]


@pytest.mark.parametrize("keep", [1, 0, -1])
def test_prune_refuses_to_keep_fewer_than_two(tmp_path: Path, keep: int) -> None:
    run = tmp_path / "run"
    for step in (1, 2, 3):
        make_checkpoint_dir(run / f"step-{step}")
    before = tree(run)
    with pytest.raises(ValueError, match="at least 2"):
        retire(complete_steps(run), keep, None)
    assert tree(run) == before


def test_prune_removes_the_marker_first_so_a_half_deleted_checkpoint_never_looks_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion of a shard fails (as a read-only directory would for a non-root user; these tests may
    run as root, so the failure is injected into os.unlink); the marker must already be gone, both when the
    deletion starts and in what is left."""
    run = tmp_path / "run"
    for step in (1, 2, 3):
        make_checkpoint_dir(run / f"step-{step}")
    real_unlink, real_rmtree = os.unlink, shutil.rmtree
    marker_at_rmtree: list[bool] = []

    def failing_unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(os.fspath(path)) == "__0_0.distcp":
            raise PermissionError(13, "Permission denied", os.fspath(path))
        real_unlink(path, *args, **kwargs)

    def spying_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        marker_at_rmtree.append((Path(path) / MARKER).exists())
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", failing_unlink)
    monkeypatch.setattr(shutil, "rmtree", spying_rmtree)
    assert prune(run, [1]) == [1]
    monkeypatch.undo()

    assert marker_at_rmtree == [False]
    assert tree(run / "step-1") == {"__0_0.distcp"}, "the failed deletion left the shard behind"
    assert complete_steps(run) == [3, 2]


# -- resume-side helpers ----------------------------------------------------------------------------------

SHARDS = [f"__{rank}_0.distcp" for rank in range(4)]


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A process group of this process alone (gloo), as a single-rank job has: no torchrun needed."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank")
def test_a_sync_save_prunes_behind_the_training_loop_and_close_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unlinking a 1 GB checkpoint takes most of a second on a slow disk: the save hands the prune to a
    thread and returns; the prunes run in order, and `close()` ends only once they are done."""
    gate = threading.Event()
    pruned: list[list[int]] = []

    def held_prune(run: Path, steps: list[int]) -> list[int]:
        assert gate.wait(30), "the test never released the prunes"
        pruned.append(prune(run, steps))
        return pruned[-1]

    monkeypatch.setattr(retention, "prune", held_prune)
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    loader = ResumableLoader(synthetic_tokens(8, 3, 10, 0), 2, 0, 1, 0)
    ckpt = tmp_path / "ckpt"
    manager = CheckpointManager(
        ckpt / "run", model=model, optimizer=optimizer, states={"scheduler": scheduler}, loader=loader, keep=2
    )
    ckpt = ckpt / "run"
    assert manager.load() == 0
    for step in (1, 2, 3, 4):
        manager.save(step, 0)  # returns with its prune held
    assert complete_steps(ckpt) == [4, 3, 2, 1] and pruned == []
    gate.set()
    manager.close()
    assert pruned == [[], [2, 1], [], []]  # in order: the first decided at step 1, the second finds all four
    assert complete_steps(ckpt) == [4, 3]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_owned_splits_the_files_so_each_is_verified_exactly_once(world: int) -> None:
    files = tuple(FileEntry(name, 1, sha256(b"")) for name in [".metadata", *SHARDS])
    per_rank = {rank: [e.name for e in owned(files, rank, world)] for rank in range(world)}

    assert Counter(n for names in per_rank.values() for n in names) == Counter(e.name for e in files)
    assert ".metadata" in per_rank[0]
    for writer, shard in enumerate(SHARDS):
        assert shard in per_rank[writer % world], (shard, per_rank)


def test_cleanup_stale_removes_interrupted_saves_and_nothing_else(tmp_path: Path) -> None:
    """Rank 0 clears the run's `.step-N.tmp` directories; every rank clears its own staging directory.
    Checkpoints, metrics and set-aside directories are evidence and stay."""
    ckpt, stage = tmp_path / "ckpt" / "run", tmp_path / "stage"
    make_checkpoint_dir(ckpt / "step-5")
    make_checkpoint_dir(ckpt / "step-3.corrupt-1")
    make_checkpoint_dir(ckpt / "step-2.superseded-1")
    (ckpt / "metrics").mkdir()
    (ckpt / "metrics" / "metrics-0.jsonl").write_bytes(b'{"train/iter": 5}\n')
    (ckpt / ".step-10.tmp").mkdir()
    (ckpt / ".step-10.tmp" / f"__0_0.distcp{PARTIAL}").write_bytes(b"half")
    (ckpt / ".step-15.tmp").mkdir()
    make_checkpoint_dir(tmp_path / "ckpt" / "other-run" / ".step-7.tmp")  # another run's: not ours
    for rank in (0, 1):
        (stage / f"rank-{rank}" / "step-10").mkdir(parents=True)
        (stage / f"rank-{rank}" / "step-10" / f"__{rank}_0.distcp").write_bytes(b"staged")
    everything = tree(tmp_path)

    store = FileRun(run_location(ckpt), stage)
    store.prepare(1, staged=True)
    assert tree(tmp_path) == {p for p in everything if not p.startswith("stage/rank-1")}

    store.prepare(0, staged=True)
    store.clean()  # rank 0
    assert tree(tmp_path) == {
        p for p in everything if not p.startswith(("stage/rank-", "ckpt/run/.step-10", "ckpt/run/.step-15"))
    }

    FileRun(run_location(tmp_path / "fresh-run"), stage).clean()  # a first start: nothing to do
    assert not (tmp_path / "fresh-run").exists()


def test_a_checkpoint_the_trainer_sets_aside_as_unrecorded_is_one_the_experiment_analysis_sees(
    tmp_path: Path,
) -> None:
    """Killed between the rename and the outbox, step 20 is complete on disk and unknown to the log: the
    trainer's resume sets it aside, and the analysis must see that, or resuming from 10 reads as a lost step."""
    recorded = sealed(tmp_path, 10)
    sealed(tmp_path, 20)
    state = apply(None, launched(RUN), ChainHead(1))
    event = msgspec.structs.replace(checkpointed(RUN, 10), uri=recorded.uri, seq=2)
    state = apply(state, event, ChainHead(2))
    run = run_dir(tmp_path, RUN)

    store = FileRun(run_location(run), tmp_path / "stage")
    set_aside_planned(store, plan_resume(state, on_disk(run), forced=True))  # as the trainer's start-up does

    assert complete_steps(run) == [10]
    assert set_aside_steps(run) == [20]


def test_set_asides_lists_every_kind_the_writers_produce_and_nothing_else(tmp_path: Path) -> None:
    run = run_dir(tmp_path, RUN)
    corrupt = set_aside(sealed(tmp_path, 30).path, "corrupt", "7")  # as `ftrain resume` skips it
    make_checkpoint_dir(run / "step-40.corrupt-unrecorded-1700000000")  # as trainers named it before
    for name in ("step-50.corrupt", "step-x.corrupt-1", "step-60.broken-1", ".step-70.tmp", "metrics"):
        make_checkpoint_dir(run / name)
    sealed(tmp_path, 10)
    store = FileRun(run_location(run), tmp_path / "stage")
    set_aside_planned(
        store, plan_resume(None, on_disk(run), fresh=True)
    )  # --no-resume, no log: 10 superseded

    assert corrupt is not None and corrupt.name == "step-30.corrupt-7"
    assert complete_steps(run) == []
    found = set_asides(run)
    assert [(s.step, s.kind) for s in found] == [(10, "superseded"), (30, "corrupt"), (40, "unrecorded")]
    assert all(s.path.parent == run and s.path.is_dir() for s in found)
    assert set_aside_steps(run) == [40]


# -- staging ----------------------------------------------------------------------------------------------


def ptr(state: dict[str, Any]) -> int:
    """Where the weight tensor of a (staged) state lives."""
    return int(state["model"]["w"].data_ptr())


def test_staging_reuses_its_buffers_and_holds_the_values_of_the_moment_it_staged() -> None:
    state: dict[str, Any] = {
        "model": {"w": torch.randn(4, 3), "b": torch.zeros(3)},
        "optim": {"state": {}},
        "progress": {"step": 3},
    }
    buffers = StagingBuffers()

    first = buffers.stage(state)
    at_stage = state["model"]["w"].clone()
    assert ptr(first) != ptr(state), "a copy, not a view of the live tensor"
    state["model"]["w"].add_(1.0)
    assert torch.equal(first["model"]["w"], at_stage), "training on does not change what was staged"

    second = buffers.stage(state)
    assert ptr(second) == ptr(first), "same-shaped state: the preallocated buffers are reused"
    assert torch.equal(second["model"]["w"], state["model"]["w"])
    assert second["progress"] == {"step": 3}

    state["optim"]["state"] = {0: {"exp_avg": torch.ones(3)}}  # the first optimizer step adds its state
    third = buffers.stage(state)
    assert ptr(third) != ptr(first), "a changed structure gets new buffers"
    assert torch.equal(third["optim"]["state"][0]["exp_avg"], torch.ones(3))
    assert torch.equal(third["model"]["w"], state["model"]["w"])
    assert ptr(buffers.stage(state)) == ptr(third)


@pytest.mark.parametrize(
    "change",
    [
        lambda state: state["model"].update(w=torch.randn(3, 4)),  # same size, another shape: no broadcast
        lambda state: state["model"].update(b=torch.zeros(1)),  # would broadcast into the old buffer
        lambda state: state["model"].update(w=torch.randn(4, 3, dtype=torch.float64)),  # would cast
        lambda state: state["progress"].update(seen=[1, 2]),  # a key more
    ],
    ids=["shape", "broadcast", "dtype", "key"],
)
def test_a_state_whose_layout_changed_is_staged_whole_into_new_buffers(change: Any) -> None:
    state: dict[str, Any] = {"model": {"w": torch.randn(4, 3), "b": torch.zeros(3)}, "progress": {"step": 3}}
    buffers = StagingBuffers()
    first = ptr(buffers.stage(state))
    change(state)
    staged = buffers.stage(state)
    assert ptr(staged) != first
    for key, value in state["model"].items():
        assert staged["model"][key].dtype == value.dtype and torch.equal(staged["model"][key], value)
    assert staged["progress"] == state["progress"]


def test_staging_copies_a_mutable_non_tensor_value_and_keeps_numbers_as_they_are() -> None:
    seen = np.array([1, 2])
    state: dict[str, Any] = {"stats": {"seen": seen, "best": 0.5, "name": "run"}}
    staged = StagingBuffers().stage(state)
    seen[0] = 9
    assert staged["stats"]["seen"].tolist() == [1, 2], "training on does not change what was staged"
    assert staged["stats"]["best"] == 0.5 and staged["stats"]["name"] == "run"


@pytest.mark.usefixtures("one_rank")
@pytest.mark.filterwarnings("ignore:Please use DTensor instead:FutureWarning")  # the deprecation exercised
def test_a_sharded_tensor_is_staged_through_torchs_helper_into_a_buffer_reused_until_its_shape_changes() -> (
    None
):
    """FSDP1's sharded state dict holds ShardedTensors: neither a plain tensor nor a DTensor, so the stage
    copies them with torch's own helper, their type, shape and dtype checked as for any tensor."""
    spec = ChunkShardingSpec(dim=0, placements=["rank:0/cpu"])
    state: dict[str, Any] = {"model": {"w": sharded_tensor.rand(spec, 4, 3)}}
    buffers = StagingBuffers()

    first = buffers.stage(state)["model"]["w"]
    assert isinstance(first, ShardedTensor)
    at_stage = state["model"]["w"].local_tensor().clone()
    state["model"]["w"].local_tensor().add_(1.0)
    assert torch.equal(first.local_tensor(), at_stage), "training on does not change what was staged"

    second = buffers.stage(state)["model"]["w"]
    assert second.local_tensor().data_ptr() == first.local_tensor().data_ptr(), "the buffer is reused"
    assert torch.equal(second.local_tensor(), state["model"]["w"].local_tensor())

    state["model"]["w"] = sharded_tensor.rand(spec, 2, 6)  # as many elements, another shape: no reshaping
    third = buffers.stage(state)["model"]["w"]
    assert third.shape == (2, 6) and torch.equal(third.local_tensor(), state["model"]["w"].local_tensor())
    assert third.local_tensor().data_ptr() != first.local_tensor().data_ptr()


# -- leftovers of a dead writer --------------------------------------------------------------------------


def test_a_writer_killed_mid_write_leaves_an_assembly_the_next_writer_on_its_host_removes(
    tmp_path: Path,
) -> None:
    """`kill -9` during `ftrain checkpoint --path` leaves `.step-N.tmp-<host>-<pid>-…`; only a dead writer's
    of this host is removed: a live writer's, another host's (its pid means nothing here) and the trainer's
    stay."""
    run, host = run_dir(tmp_path, RUN), socket.gethostname()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = make_checkpoint_dir(assembly_dir(run, 5, process_writer(host, gone.pid, "a1")), marker=False)
    live = make_checkpoint_dir(assembly_dir(run, 6, process_writer(host, os.getpid(), "b2")), marker=False)
    remote = make_checkpoint_dir(
        assembly_dir(run, 7, process_writer("elsewhere", gone.pid, "c3")), marker=False
    )
    trainer = make_checkpoint_dir(assembly_dir(run, 8, "attempt-2"), marker=False)

    sealed(tmp_path, 9)

    assert not dead.exists()
    assert [p.exists() for p in (live, remote, trainer)] == [True, True, True]
    assert assembly_writer(live) == (host, os.getpid())
    assert assembly_writer(trainer) is None

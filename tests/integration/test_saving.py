"""The one save sequence (`ftrain.train.saving.Saver`) on the file system and on a real S3 server (moto), in a
real one-process gloo group: DCP writes real shards, the store seals them. A save that cannot land fails closed
and training goes on, `max_failed_saves` in a row stop the job, a newer attempt fences this one, and the prune
behind the loop keeps the newest two."""

import hashlib
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from ftrain.domain.lifecycle import OnDisk
from ftrain.events.schema import RETIRED_MAX
from ftrain.train.config import CheckpointConfig
from ftrain.train.saving import Saver, SavesFailing
from ftrain.workers.manifest import FileEntry, Manifest, encode_manifest
from ftrain.workers.storage.file.run_dir import FileRun
from ftrain.workers.storage.location import run_location
from ftrain.workers.storage.port import RunStorage
from ftrain.workers.storage.storage_errors import Fenced
from tests.integration.test_storage_conformance import RUN, Backend, s3_backend
from tests.integration.test_storage_conformance import save as seal_elsewhere


@pytest.fixture(autouse=True)
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(params=["file", "moto"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    if request.param == "file":
        return Backend((tmp_path / "ckpt").as_uri(), tmp_path / "stage", {})
    return s3_backend(request.getfixturevalue("moto"), tmp_path, monkeypatch)


def manifest_of(step: int, epoch: int, entries: list[FileEntry]) -> Manifest:
    return Manifest(
        run_id=RUN,
        step=step,
        epoch=epoch,
        shards=1,
        world_size=1,
        dataset_revision=None,
        created_at=datetime.now(UTC),
        files=tuple(sorted(entries, key=lambda e: e.name)),
    )


def saver(
    store: RunStorage,
    recorded: list[tuple[int, str]],
    *,
    keep: int = 3,
    max_failed_saves: int = 3,
    run_id: str | None = None,
    retired: list[tuple[int, ...]] | None = None,
    digest: str = "sha256",
) -> Saver:
    """What the manager makes: a saver on `store`, recording (step, URI) for each sealed step and, into
    `retired`, the steps each record names as retired; with `run_id`, a run the log knows."""
    settings = CheckpointConfig(
        location=store.location,
        stage_dir=Path("/nonexistent"),
        keep=keep,
        max_failed_saves=max_failed_saves,
        run_id=run_id,
        digest=digest,
    )
    store.prepare(0, staged=True)
    group = dist.new_group(backend="gloo")

    def record(step: int, _e: int, uri: str, _h: str, _m: Manifest, gone: tuple[int, ...]) -> None:
        recorded.append((step, uri))
        if retired is not None:
            retired.append(gone)

    return Saver(settings, group, manifest_of, record, store)


@pytest.mark.parametrize("staged", [False, True])
def test_saves_land_are_recorded_and_the_prune_keeps_the_newest_two(backend: Backend, staged: bool) -> None:
    store, recorded = backend.store(), list[tuple[int, str]]()
    saves = saver(store, recorded, keep=2)
    for step in (1, 2, 3, 4):
        saves.save(step, 0, {"w": torch.full((4,), float(step))}, 0, staged=staged)
    saves.close()
    assert [step for step, _ in recorded] == [1, 2, 3, 4]
    assert [d.step for d in store.complete()] == [4, 3]
    assert not [p for p in backend.stage.rglob("*") if p.is_file()], "no work file left behind"


@pytest.mark.parametrize("staged", [False, True])
def test_a_save_hashed_with_blake3_records_it_per_file_and_verifies_and_downloads_by_it(
    backend: Backend, staged: bool
) -> None:
    """Sync and async saves, on a file system and on S3 (uploaded with the digests taken as DCP wrote):
    every data file's digest names blake3, the checkpoint's own hash stays the manifest's SHA-256, and both
    the CLI's verify and a rank's download for a resume check each file by blake3."""
    store, recorded = backend.store(), list[tuple[int, str]]()
    saves = saver(store, recorded, digest="blake3")
    saves.save(1, 0, {"w": torch.arange(4096, dtype=torch.float32)}, 0, staged=staged)
    saves.close()
    (found,) = store.complete()
    assert found.digest is not None
    manifest = store.read_manifest(found.uri, found.digest)
    assert isinstance(manifest, Manifest)
    assert {f.algorithm for f in manifest.files} == {"blake3"} and len(manifest.files) == 2
    assert found.digest == hashlib.sha256(encode_manifest(manifest)).hexdigest()
    assert store.verify(found.uri, found.digest, run_id=RUN, step=1) is None
    with store.readable(found.uri, manifest, manifest.files, start="blake3", rank=0) as readable:
        assert readable.verdict is None


def test_saves_that_cannot_land_fail_closed_and_past_the_limit_stop_the_job(
    backend: Backend, capfd: pytest.CaptureFixture[str]
) -> None:
    gone, recorded = backend.out_of_reach(), list[tuple[int, str]]()
    saves = saver(gone, recorded, max_failed_saves=2)
    saves.save(1, 0, {"w": torch.ones(4)}, 0, staged=False)  # fails closed: training goes on
    assert "checkpoint at step 1 not saved (1 of 2 failures in a row allowed" in capfd.readouterr().err
    with pytest.raises(
        SavesFailing, match=r"^2 checkpoint saves in a row failed \(limit 2\), the last at step 2"
    ):
        saves.save(2, 0, {"w": torch.ones(4)}, 0, staged=True)
    saves.close()
    assert recorded == []

    store = backend.store()  # storage back: the count starts over once a save lands
    saves = saver(store, recorded, max_failed_saves=2)
    saves.save(3, 0, {"w": torch.ones(4)}, 0, staged=False)
    saves.close()
    assert [d.step for d in store.complete()] == [3] and [s for s, _ in recorded] == [3]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB file system (tmpfs; mounting needs root, as CI runs), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_fails_the_save_closed_and_past_the_limit_stops_the_job(
    small_disk: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A save that fills the disk: torch's writer says so with a RuntimeError (its zip writer's "unexpected
    pos"), a delivery from node-local staging with OSError ENOSPC. Either fails the save closed: one warning
    line naming the type, the partial step removed, nothing recorded, and training goes on until
    `max_failed_saves` failures in a row stop it."""
    store = FileRun(run_location(small_disk / RUN), tmp_path / "stage")
    recorded = list[tuple[int, str]]()
    saves = saver(store, recorded, max_failed_saves=2)
    big = {"w": torch.ones(200_000)}  # 800 KB
    saves.save(1, 0, {"w": torch.ones(4)}, 0, staged=False)
    saves.save(2, 0, big, 0, staged=False)
    assert (
        "checkpoint at step 2 not saved (1 of 2 failures in a row allowed before stopping): RuntimeError"
        in (capfd.readouterr().err)
    )
    saves.save(3, 0, {"w": torch.ones(4)}, 0, staged=False)  # space enough again: the count starts over
    saves.save(4, 0, big, 0, staged=True)
    assert "checkpoint at step 4 not saved (1 of 2 failures in a row allowed before stopping): OSError" in (
        capfd.readouterr().err
    )
    with pytest.raises(
        SavesFailing, match=r"^2 checkpoint saves in a row failed \(limit 2\), the last at step 5"
    ):
        saves.save(5, 0, big, 0, staged=False)
    saves.close()
    assert [step for step, _ in recorded] == [1, 3]
    assert sorted(os.listdir(small_disk / RUN)) == ["step-1", "step-3"], "a partial step left behind"
    assert store.clean() == []


def test_a_newer_attempt_fences_the_save_and_nothing_is_sealed(backend: Backend) -> None:
    store, recorded = backend.store(), list[tuple[int, str]]()
    store.claim(3)
    saves = saver(store, recorded)
    with pytest.raises(Fenced, match="attempt 2 is superseded by attempt 3"):
        saves.save(5, 0, {"w": torch.ones(4)}, 2, staged=False)
    saves.save(6, 0, {"w": torch.ones(4)}, 3, staged=False)
    saves.close()
    assert [d.step for d in store.complete()] == [6] and [s for s, _ in recorded] == [6]
    assert store.clean() == [], "the fenced save's partial step was discarded"


def test_retention_counts_and_deletes_only_what_the_log_accepted(backend: Backend) -> None:
    """Steps 5, 10 and 15 are the log's; 20 was sealed by an older attempt after the log moved on (it refused
    it). A listing would count 20 and, at step 25 with keep=3, delete 10 and 5, leaving the log one
    checkpoint; by the log's steps 20 is neither counted nor deleted (the next resume sets it aside), the
    newest three the log accepted always stay, and each record names what it retires."""
    store, recorded, retired = backend.store(), list[tuple[int, str]](), list[tuple[int, ...]]()
    for step in (5, 10, 15, 20):
        seal_elsewhere(store, step)
    saves = saver(store, recorded, run_id=RUN, retired=retired)
    saves.vouched([15, 10, 5], [])  # what the log vouched for at start-up
    kept = []
    for step in (25, 30, 35):
        saves.save(step, 0, {"w": torch.full((4,), float(step))}, 0, staged=False)
        kept.append([d.step for d in _settled(saves, store)])
    saves.close()
    assert kept == [[25, 20, 15, 10], [30, 25, 20, 15], [35, 30, 25, 20]]
    assert retired == [(5,), (10,), (15,)]


def test_a_retired_step_still_on_disk_is_deleted_by_the_next_prune_and_not_named_again(
    backend: Backend,
) -> None:
    """The log named step 5 retired but the job was stopped before deleting it: the next save deletes it."""
    store, recorded, retired = backend.store(), list[tuple[int, str]](), list[tuple[int, ...]]()
    for step in (5, 10, 15):
        seal_elsewhere(store, step)
    saves = saver(store, recorded, run_id=RUN, retired=retired)
    saves.vouched([15, 10], [5])
    saves.save(20, 0, {"w": torch.ones(4)}, 0, staged=False)
    saves.close()
    assert retired == [()]
    assert [d.step for d in store.complete()] == [20, 15, 10]


def test_one_record_retires_at_most_retired_max_steps_the_oldest_first(backend: Backend) -> None:
    """A run whose log vouches for more old checkpoints than one event may name (an upgrade from before
    retention recorded them): each record names at most RETIRED_MAX, the oldest first, and the rest go with
    the next saves; the log never gets an unbounded list."""
    store, recorded, retired = backend.store(), list[tuple[int, str]](), list[tuple[int, ...]]()
    old = list(range(1, RETIRED_MAX + 6))
    saves = saver(store, recorded, run_id=RUN, retired=retired)
    saves.vouched(sorted(old, reverse=True), [])
    for step in (1000, 1001):
        saves.save(step, 0, {"w": torch.ones(4)}, 0, staged=False)
    saves.close()
    # keep=3: after 1000, 67 of the 69 old steps are beyond the newest three (1000, 69, 68)
    assert sorted(retired[0]) == old[:RETIRED_MAX], "the oldest first, RETIRED_MAX of them"
    assert sorted(retired[1]) == old[RETIRED_MAX:-1], "the rest with the next save (69 is now beyond keep)"


def _settled(saves: Saver, store: RunStorage) -> list[OnDisk]:
    """The run's sealed steps once the prune in flight is done."""
    saves._pruner.submit(lambda: None).result(timeout=60)
    return store.complete()

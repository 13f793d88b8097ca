"""The memory tier's node-local side on real files: its layout, its confinement (private, never through a
link, never another user's), the cap, a part judged unavailable or corrupt, and the drop of older
snapshots; the replicas held for another node's rank (its buddy pairing, its layout, its verification on
arrival, its drop with the older snapshots) and a part restored from one at resume."""

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ftrain import settings
from ftrain.host.nofollow import remove_dir
from ftrain.workers.integrity import digest_of, to_hex
from ftrain.workers.layout import MANIFEST
from ftrain.workers.manifest import FileEntry, Manifest, encode_manifest
from ftrain.workers.memory_tier import (
    SnapshotUnavailable,
    UnsafeDirectory,
    admit,
    begin_rank,
    buddy,
    concatenated,
    held_bytes,
    judge,
    keep_replica,
    local_entries,
    memory_root,
    named,
    node_parts,
    prune,
    rank_dir,
    ready_root,
    remove_rank,
    replica_dir,
    restore_part,
    seal_rank,
    snapshot_dir,
)

RUN = "run-a"


def test_the_layout_is_per_user_job_step_and_rank(tmp_path: Path) -> None:
    root = memory_root(tmp_path, "job-1")
    assert root == tmp_path / f"ftrain-{os.getuid()}" / "job-1"
    assert rank_dir(root, 30, 1) == root / "step-30" / "rank-1"
    files = named(1, [FileEntry("__0_0.distcp", 3, digest_of(b"abc"))])
    assert [f.name for f in files] == ["rank-1/__0_0.distcp"]
    manifest = _manifest(30, [*files, *named(0, [FileEntry(".metadata", 1, digest_of(b"m"))])])
    assert [f.name for f in local_entries(manifest, 1)] == ["__0_0.distcp"]


def test_the_root_is_made_private_and_a_link_or_an_open_directory_is_refused(tmp_path: Path) -> None:
    root = ready_root(memory_root(tmp_path, "job"))
    assert oct(root.stat().st_mode & 0o777) == "0o700" and oct(root.parent.stat().st_mode & 0o777) == "0o700"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (root.parent / "linked").symlink_to(elsewhere)
    with pytest.raises(UnsafeDirectory, match="memory snapshot directory"):
        ready_root(root.parent / "linked")
    open_dir = root.parent / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UnsafeDirectory, match="writable by group or others"):
        ready_root(open_dir)
    if os.getuid() == 0:  # root can hand a directory to another user, as another user would have planted it
        theirs = root.parent / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 4242, -1)
        with pytest.raises(UnsafeDirectory, match="FTRAIN_MEMORY_DIR"):
            ready_root(theirs)


def test_a_planted_link_in_place_of_a_rank_part_is_unlinked_never_written_through(tmp_path: Path) -> None:
    root = ready_root(memory_root(tmp_path, "job"))
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "keep").write_text("x")
    begin_rank(root, 5, 0)
    os.rmdir(rank_dir(root, 5, 0))
    rank_dir(root, 5, 0).symlink_to(victim)
    path = begin_rank(root, 5, 0)
    assert path.is_dir() and not path.is_symlink() and (victim / "keep").exists()


@pytest.mark.parametrize(
    ("need", "held", "cap", "free", "refusal"),
    [
        (10, 0, None, 100, None),
        (10, 10, 20, 100, None),
        (10, 11, 20, 100, "10 bytes beside the 11 held would exceed the cap of 20 bytes"),
        (51, 0, None, 100, "51 bytes would take more than 50% of the free memory (100 of 1000 free)"),
    ],
)
def test_a_snapshot_is_admitted_only_within_the_cap_and_half_the_free_memory(
    need: int, held: int, cap: int | None, free: int, refusal: str | None
) -> None:
    assert admit(need, held, cap, free, 1000) == refusal


def test_the_settings_parse_once_where_they_are_defined() -> None:
    assert settings.memory_every({}) is None and settings.memory_every({"FTRAIN_MEMORY_EVERY": "off"}) == 0
    assert settings.memory_every({"FTRAIN_MEMORY_EVERY": "25"}) == 25
    assert settings.memory_cap({"FTRAIN_MEMORY_CAP_MB": "2"}) == 2 << 20
    assert settings.memory_dir({}) == Path("/dev/shm")


@pytest.mark.parametrize(
    ("parse", "name", "value"),
    [
        (settings.memory_every, "FTRAIN_MEMORY_EVERY", "5min"),
        (settings.memory_cap, "FTRAIN_MEMORY_CAP_MB", "0"),
        (settings.memory_dir, "FTRAIN_MEMORY_DIR", "relative"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_variable(
    parse: Callable[[dict[str, str]], object], name: str, value: str
) -> None:
    with pytest.raises(settings.InvalidSetting, match=name):
        parse({name: value})


def _manifest(step: int, files: list[FileEntry]) -> Manifest:
    return Manifest(run_id=RUN, step=step, epoch=0, shards=2, world_size=2, dataset_revision=None,
                    created_at=datetime(2026, 12, 6, tzinfo=UTC), files=tuple(files))  # fmt: skip


def _snapshot(root: Path, step: int) -> str:
    """A sealed two-rank snapshot of `step` (hand-written files); the hash its event would carry."""
    files = []
    for rank in (0, 1):
        path = begin_rank(root, step, rank)
        body = f"rank {rank} step {step}".encode()
        (path / "__0_0.distcp").write_bytes(body)
        files += named(rank, [FileEntry("__0_0.distcp", len(body), digest_of(body))])
    manifest = _manifest(step, files)
    for rank in (0, 1):
        seal_rank(rank_dir(root, step, rank), manifest, attempt=1)
    return to_hex(digest_of(encode_manifest(manifest)))


def test_each_rank_judges_its_own_part_against_the_log_and_tells_unavailable_from_corrupt(
    tmp_path: Path,
) -> None:
    root = ready_root(memory_root(tmp_path, "job"))
    expected = _snapshot(root, 10)
    assert isinstance(judge(root, 10, 0, expected, RUN), Manifest)
    assert isinstance(judge(root, 10, 1, expected, RUN), Manifest)
    assert judge(root, 10, 0, "0" * 64, RUN) == "hash mismatch", "a manifest the log does not vouch for"
    assert (
        judge(root, 10, 0, expected, "other") == f"manifest is run {RUN} step 10, expected run other step 10"
    )
    missing = judge(root, 20, 0, expected, RUN)
    assert isinstance(missing, SnapshotUnavailable) and "no snapshot of step 20" in missing.reason
    data = rank_dir(root, 10, 1) / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[::-1])
    assert judge(root, 10, 1, expected, RUN) == "file __0_0.distcp hash mismatch"
    data.unlink()
    assert judge(root, 10, 1, expected, RUN) == "file __0_0.distcp missing", "sealed, then damaged: corrupt"
    (rank_dir(root, 10, 0) / ".complete").unlink()
    assert isinstance(judge(root, 10, 0, expected, RUN), SnapshotUnavailable), "never completed here"


def test_older_snapshots_are_dropped_as_new_ones_land_and_a_completed_run_removes_them_all(
    tmp_path: Path,
) -> None:
    root = ready_root(memory_root(tmp_path, "job"))
    _snapshot(root, 10)
    _snapshot(root, 20)
    per_rank = held_bytes(root, 0)
    assert per_rank == held_bytes(root, 1) > 0
    prune(root, 0, keep=20)
    assert sorted(p.name for p in root.iterdir()) == ["step-10", "step-20"], "rank 1's part of step 10 stays"
    prune(root, 1, keep=20)
    assert sorted(p.name for p in root.iterdir()) == ["step-20"], "the node's last rank removes the step"
    assert held_bytes(root, 0) < per_rank
    assert not remove_rank(root, 0) and root.exists(), "rank 1's part is still there"
    assert remove_rank(root, 1) and not root.exists(), "the node's last rank removes the job's directory"


def test_each_rank_is_paired_with_the_same_local_rank_on_the_next_node_and_one_node_has_none() -> None:
    assert [buddy(r, 2, 4) for r in range(4)] == [2, 3, 0, 1], "2 nodes of 2: across, never beside"
    assert [buddy(r, 2, 6) for r in range(6)] == [2, 3, 4, 5, 0, 1], "a ring over 3 nodes"
    assert [buddy(r, 1, 2) for r in range(2)] == [1, 0]
    assert buddy(0, 2, 2) is None and buddy(1, 4, 4) is None, "one node: no other node to hold a replica"


def _replica(
    tmp_path: Path, sent: Callable[[bytes], bytes] = bytes
) -> tuple[Path, Manifest, str, str | None]:
    """Node A's snapshot of step 10, and rank 0's part of it arrived at node B as `sent` makes it: node B's
    root, the manifest, its digest, and why the replica was dropped (None: kept)."""
    node_a, node_b = (ready_root(memory_root(tmp_path / n, "job")) for n in ("a", "b"))
    expected = _snapshot(node_a, 10)
    manifest = judge(node_a, 10, 0, expected, RUN)
    assert isinstance(manifest, Manifest)
    part = concatenated(rank_dir(node_a, 10, 0), local_entries(manifest, 0))
    return node_b, manifest, expected, keep_replica(node_b, 10, 0, manifest, sent(part), attempt=1)


def test_a_replica_is_verified_on_arrival_and_sealed_as_a_part_or_dropped(tmp_path: Path) -> None:
    node_b, _, expected, dropped = _replica(tmp_path / "kept")
    assert dropped is None and replica_dir(node_b, 10, 0) == node_b / "step-10" / "replica-0"
    assert isinstance(judge(node_b, 10, 0, expected, RUN, replica=True), Manifest)
    assert isinstance(judge(node_b, 10, 0, expected, RUN), SnapshotUnavailable), "not rank 0's own part"

    node_b, *_, dropped = _replica(tmp_path / "flipped", lambda b: b[:-1] + bytes([b[-1] ^ 1]))
    assert dropped == "file __0_0.distcp hash mismatch" and not replica_dir(node_b, 10, 0).exists()
    node_b, *_, dropped = _replica(tmp_path / "short", lambda b: b[:5])
    assert dropped == "5 bytes received, the manifest lists 14" and not replica_dir(node_b, 10, 0).exists()


def test_replicas_count_against_the_cap_and_are_dropped_with_older_snapshots(tmp_path: Path) -> None:
    root = ready_root(memory_root(tmp_path, "job"))
    for step in (10, 20):
        _snapshot(root, step)
        replica = begin_rank(root, step, 3, replica=True)
        (replica / "__0_0.distcp").write_bytes(b"x" * 100)
    assert held_bytes(root, 0, source=3) == held_bytes(root, 0) + 200
    prune(root, 0, keep=20, source=3)
    assert not replica_dir(root, 10, 3).exists() and replica_dir(root, 20, 3).exists()
    assert (root / "step-10" / "rank-1").exists(), "rank 1's part is its own to drop"
    prune(root, 1, keep=20)
    assert sorted(p.name for p in root.iterdir()) == ["step-20"]
    assert not remove_rank(root, 0, source=3) and not replica_dir(root, 20, 3).exists()
    assert remove_rank(root, 1) and not root.exists()


def test_what_an_earlier_world_left_on_a_node_is_dropped_by_its_first_rank(tmp_path: Path) -> None:
    assert node_parts(0, 1, 2) == {"rank-0", "replica-1"}, "2 nodes of 1: a part and its source's replica"
    assert node_parts(3, 2, 4) == {"rank-2", "rank-3", "replica-0", "replica-1"}
    assert node_parts(1, 2, 2) == {"rank-0", "rank-1"}, "one node: no replicas"
    # 2 nodes of 1 rank left rank 0's part and rank 1's replica of step 10 here, then the job came back as 1
    # node of 2 ranks: neither of them holds replica-1 as its own
    root = ready_root(memory_root(tmp_path, "job"))
    _snapshot(root, 10)
    remove_dir(snapshot_dir(root, 10), "rank-1")
    begin_rank(root, 10, 1, replica=True)
    _snapshot(root, 20)
    prune(root, 1, keep=20)
    prune(root, 0, keep=20, strays=node_parts(0, 2, 2))
    assert sorted(p.name for p in root.iterdir()) == ["step-20"], "the stray replica went with its step"
    begin_rank(root, 5, 7, replica=True)
    assert not remove_rank(root, 1) and remove_rank(root, 0, strays=node_parts(0, 2, 2))


def test_a_part_sent_back_is_restored_only_with_the_manifest_the_log_vouches_for(tmp_path: Path) -> None:
    node_b, manifest, expected, _ = _replica(tmp_path)
    path = replica_dir(node_b, 10, 0)
    raw, files = (path / MANIFEST).read_bytes(), concatenated(path, local_entries(manifest, 0))
    node_a = ready_root(memory_root(tmp_path / "a-again", "job"))
    assert restore_part(node_a, 10, 0, "0" * 64, 2, raw, files) == (
        "the manifest sent is not the one the log vouches for"
    )
    assert isinstance(judge(node_a, 10, 0, expected, RUN), SnapshotUnavailable), "nothing written"
    assert restore_part(node_a, 10, 0, expected, 2, raw, files) is None
    assert isinstance(judge(node_a, 10, 0, expected, RUN), Manifest), "judged as any part before it is used"
    restore_part(node_a, 10, 0, expected, 2, raw, files[:-1] + b"!")
    assert judge(node_a, 10, 0, expected, RUN) == "file __0_0.distcp hash mismatch", "corrupt, not loaded"

"""The memory tier's node-local side: where each rank's snapshots live, how much memory they may hold, and how
one rank's part of a snapshot is sealed, judged and dropped.

A snapshot lives in node-local memory that outlives the trainer process (a tmpfs, /dev/shm by default), as
`<memory dir>/ftrain-<uid>/<job>/step-<N>/rank-<r>/`: each rank's DCP files (written by that rank alone, so
they hold all it needs to resume and its node holds them whoever else is lost), then a copy of the
snapshot's manifest and its completion marker, written last. The manifest lists every rank's files, named
`rank-<r>/<file>` with their digests; its digest is what the `snapshotted` event records, so each rank checks
its own files against the log, never against what lies beside them.

On a job of several nodes each rank also holds its source's part (`buddy`: the same local rank on the node
before) as `step-<N>/replica-<source>/`, laid out and sealed as a part of its own, so a node lost whole
has its state on the next node; a replica counts against the cap of the rank that holds it, and is dropped
with that rank's older snapshots.

The directories are private to their user, as the stage directory is (`host.private_files` decides: 0700,
a link or another user's directory refused, never adopted); removal never follows a link
(`host.nofollow`). A rank's snapshots are bounded: a new one is admitted only when it fits the cap (when one
is set) beside those it holds already, and takes at most half of what the tmpfs has free.

"Unavailable" (no marker: never completed here, or the node lost it) is told from "corrupt" (a completed
snapshot whose bytes do not match its manifest, or whose manifest does not match the log).
"""

import os
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Final

import msgspec
import structlog

from ftrain.host.atomic_file import write_atomic
from ftrain.host.nofollow import remove_dir
from ftrain.host.private_files import UnsafeDirectory, check_dir, safe_dir
from ftrain.workers.integrity import digest_of, to_hex
from ftrain.workers.layout import MANIFEST, MARKER
from ftrain.workers.manifest import FileEntry, Manifest, Marker, decode_manifest, encode_manifest
from ftrain.workers.stage_dir import claim_dir
from ftrain.workers.storage.file.checkpoint_dir import read_manifest
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.storage.verdict import verify_files

__all__ = [
    "FREE_SHARE",
    "SnapshotUnavailable",
    "UnsafeDirectory",
    "admit",
    "begin_rank",
    "buddy",
    "concatenated",
    "held_bytes",
    "judge",
    "keep_replica",
    "local_entries",
    "memory_root",
    "named",
    "node_parts",
    "prune",
    "rank_dir",
    "ready_root",
    "remove_rank",
    "replica_dir",
    "restore_part",
    "room",
    "seal_rank",
    "snapshot_dir",
]
log = structlog.get_logger(__name__)

LABEL: Final = "memory snapshot directory"
CHOOSE: Final = "choose another with FTRAIN_MEMORY_DIR"
FREE_SHARE: Final = 0.5
"""The most of the tmpfs's free space one snapshot may take: it is the node's memory, the training's too."""
_STEP = re.compile(r"step-(\d+)\Z")
_PART = re.compile(r"(rank|replica)-\d+\Z")


class SnapshotUnavailable(msgspec.Struct, frozen=True):
    """This rank's part of a snapshot is not here (never completed on this node, or the node lost it): no
    defect of the snapshot, and nothing to record as corrupt."""

    reason: str


def memory_root(memory_dir: Path, job: str) -> Path:
    """This user's snapshots of `job` on this node: `<memory dir>/ftrain-<uid>/<job>`."""
    return memory_dir / f"ftrain-{os.getuid()}" / job


def snapshot_dir(root: Path, step: int) -> Path:
    return root / f"step-{step}"


def rank_dir(root: Path, step: int, rank: int) -> Path:
    return snapshot_dir(root, step) / f"rank-{rank}"


def replica_dir(root: Path, step: int, source: int) -> Path:
    """Where the rank that holds `source`'s replica keeps it: beside that rank's own part of the snapshot."""
    return snapshot_dir(root, step) / f"replica-{source}"


def buddy(rank: int, local_world: int, world: int) -> int | None:
    """The rank that holds `rank`'s replica: the same local rank on the next node (ranks are numbered node by
    node, `local_world` to a node); None on a job of one node, which has no other node to hold it."""
    return None if world <= local_world else (rank + local_world) % world


def node_parts(rank: int, local_world: int, world: int) -> frozenset[str]:
    """The parts of a snapshot the ranks of `rank`'s node hold in a world of `world` ranks, `local_world` to a
    node: their own, and the replicas of their sources (`buddy`'s inverse)."""
    first = rank - rank % local_world
    ranks = range(first, min(first + local_world, world))
    sources = [] if buddy(rank, local_world, world) is None else [(r - local_world) % world for r in ranks]
    return frozenset([*(f"rank-{r}" for r in ranks), *(f"replica-{s}" for s in sources)])


def _parts(rank: int, source: int | None) -> list[str]:
    """The directories of a snapshot that a rank holds: its own part, and `source`'s replica (if any)."""
    return [f"rank-{rank}", *([f"replica-{source}"] if source is not None else [])]


def named(rank: int, entries: Sequence[FileEntry]) -> list[FileEntry]:
    """A rank's files as the snapshot's manifest names them: under `rank-<r>/`."""
    return [FileEntry(f"rank-{rank}/{e.name}", e.size, e.digest) for e in entries]


def local_entries(manifest: Manifest, rank: int) -> list[FileEntry]:
    """The manifest's files of `rank`, by their names in its own directory."""
    prefix = f"rank-{rank}/"
    return [
        FileEntry(e.name.removeprefix(prefix), e.size, e.digest)
        for e in manifest.files
        if e.name.startswith(prefix)
    ]


def ready_root(root: Path) -> Path:
    """`root` created (0700, with missing parents) unless it exists; UnsafeDirectory unless it is a private
    directory of this user's below directories no one else controls."""
    return safe_dir(root, label=LABEL, choose=CHOOSE)


def admit(need: int, held: int, cap: int | None, free: int, total: int) -> str | None:
    """Why a snapshot of `need` bytes may not be written beside the `held` bytes of this rank's snapshots
    (with `cap` bytes allowed, None: no cap) on a tmpfs of `total` bytes with `free` free; None: it may."""
    if cap is not None and held + need > cap:
        return f"{need} bytes beside the {held} held would exceed the cap of {cap} bytes"
    if need > free * FREE_SHARE:
        return (
            f"{need} bytes would take more than {FREE_SHARE:.0%} of the free memory ({free} of {total} free)"
        )
    return None


def room(root: Path) -> tuple[int, int]:
    """(free, total) bytes of the file system `root` is on."""
    stats = os.statvfs(root)
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize


def _steps(root: Path) -> list[int]:
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := _STEP.match(name)))


def held_bytes(root: Path, rank: int, source: int | None = None) -> int:
    """The bytes of this rank's snapshots under `root`, and of the replicas of `source`'s it holds (links
    neither followed nor counted)."""
    total = 0
    for step, part in ((s, p) for s in _steps(root) for p in _parts(rank, source)):
        try:
            with os.scandir(snapshot_dir(root, step) / part) as found:
                total += sum(
                    e.stat(follow_symlinks=False).st_size for e in found if e.is_file(follow_symlinks=False)
                )
        except (FileNotFoundError, NotADirectoryError):
            continue
    return total


def begin_rank(root: Path, step: int, rank: int, *, replica: bool = False) -> Path:
    """A fresh private directory for `rank`'s part of the snapshot of `step`, or (`replica`) for the replica
    of it held here (what a crashed one left there is removed first, a link there unlinked, never followed)."""
    step_dir = snapshot_dir(root, step)
    part = (replica_dir if replica else rank_dir)(root, step, rank).name
    claim_dir(root, step_dir.name, label=LABEL, choose=CHOOSE)
    remove_dir(step_dir, part, unlink_link=True)
    claim_dir(step_dir, part, label=LABEL, choose=CHOOSE)
    return step_dir / part


def concatenated(path: Path, entries: Sequence[FileEntry]) -> bytes:
    """The files of `entries` under `path`, one after another in their order: a part as it is sent."""
    return b"".join((path / e.name).read_bytes() for e in entries)


def _place(path: Path, entries: Sequence[FileEntry], sent: bytes) -> str | None:
    """The part `sent` (`concatenated`) split into the files of `entries` under `path`, none of them parsed
    nor yet verified; None, or why it cannot be (its length is not the entries')."""
    if len(sent) != sum(e.size for e in entries):
        return f"{len(sent)} bytes received, the manifest lists {sum(e.size for e in entries)}"
    offset = 0
    for entry in entries:
        write_atomic(path / entry.name, sent[offset : offset + entry.size])
        offset += entry.size
    return None


def restore_part(
    root: Path, step: int, rank: int, expected_hash: str, attempt: int, manifest: bytes, files: bytes
) -> str | None:
    """`rank`'s part of the snapshot of `step`, as its buddy sent it back (the manifest's bytes, the files
    `concatenated`), written and sealed here when the manifest's bytes are the log's (`expected_hash`),
    checked before they are decoded; else nothing is written and why is returned. The files are not
    verified here: the resume judges the part as any other before it loads a byte."""
    if to_hex(digest_of(manifest)) != expected_hash:
        return "the manifest sent is not the one the log vouches for"
    path = begin_rank(root, step, rank)
    if (refused := _place(path, local_entries(decode_manifest(manifest), rank), files)) is not None:
        return refused
    _seal_raw(path, manifest, step, attempt)
    return None


def keep_replica(
    root: Path, step: int, source: int, manifest: Manifest, sent: bytes, attempt: int
) -> str | None:
    """`source`'s part of the snapshot of `step` as it arrived (`sent`, its files `concatenated`) kept here as
    its replica: written, every file hashed against `manifest`, sealed; None, or why it was dropped (a
    mismatch: nothing of it stays)."""
    path = begin_rank(root, step, source, replica=True)
    entries = local_entries(manifest, source)
    if (defect := _place(path, entries, sent) or verify_files(path, entries)) is not None:
        remove_dir(snapshot_dir(root, step), path.name, first=MARKER)
        return defect
    seal_rank(path, manifest, attempt)
    return None


def seal_rank(path: Path, manifest: Manifest, attempt: int) -> None:
    """This rank's copy of the snapshot's manifest, then its completion marker: the part is complete."""
    _seal_raw(path, encode_manifest(manifest), manifest.step, attempt)


def _seal_raw(path: Path, raw: bytes, step: int, attempt: int) -> None:
    """The manifest's bytes `raw` (as encoded, never re-encoded), then the completion marker of `step`."""
    write_atomic(path / MANIFEST, raw)
    write_atomic(path / MARKER, msgspec.json.encode(Marker(digest_of(raw), step, attempt)))


def judge(
    root: Path, step: int, rank: int, expected_hash: str, run_id: str, *, replica: bool = False
) -> Manifest | SnapshotUnavailable | str:
    """`rank`'s part of the snapshot of `step` on this node (`replica`: the replica of it held here): the
    manifest when it is the log's (`expected_hash`), of `run_id` at `step`, and every file of the part
    matches it; SnapshotUnavailable when the part never completed here (no marker) or cannot be read; else
    why it is corrupt."""
    path = (replica_dir if replica else rank_dir)(root, step, rank)
    try:
        os.lstat(path / MARKER)
    except OSError as exc:
        return SnapshotUnavailable(
            f"rank {rank} has no snapshot of step {step} on this node ({exc.strerror})"
        )
    try:
        check_dir(path, what=f"{LABEL} {path}", choose=CHOOSE)
        manifest = read_manifest(path, expected_hash, run_id=run_id, step=step)
        if isinstance(manifest, str):
            return manifest
        return verify_files(path, local_entries(manifest, rank)) or manifest
    except (UnsafeDirectory, StorageUnavailable, OSError) as exc:
        return SnapshotUnavailable(f"rank {rank}'s snapshot of step {step} unreadable: {exc}")


def prune(
    root: Path, rank: int, keep: int | None, source: int | None = None, strays: Collection[str] | None = None
) -> None:
    """Drop this rank's snapshots other than the one of step `keep` (None: all), with the replicas of
    `source`'s it holds, and step directories left empty. With `strays` (on the node's first rank: the parts
    its node's ranks hold in this world, `node_parts`), also every other part of those steps: what an
    earlier world left on this node (the job resumed on fewer nodes, or more ranks to a node), which no rank
    of this one holds as its own. Never follows a link; what cannot be removed is left for the next prune."""
    for step in _steps(root):
        if step == keep:
            continue
        step_dir = snapshot_dir(root, step)
        try:
            parts = _parts(rank, source)
            if strays is not None:
                parts += [n for n in os.listdir(step_dir) if _PART.match(n) and n not in strays]
            for part in parts:
                remove_dir(step_dir, part, first=MARKER)
            os.rmdir(step_dir)  # the node's last rank of the step removes it
        except FileNotFoundError:
            continue
        except OSError:  # another rank's part is still there, or it cannot be removed now
            continue


def remove_rank(
    root: Path, rank: int, source: int | None = None, strays: Collection[str] | None = None
) -> bool:
    """Remove every snapshot part of this rank and replica of `source`'s (the run completed), with `strays`
    as `prune`, and `root` once the node's last rank left it empty; whether `root` is gone. Each rank
    removes its own (the node's first rank the strays): two ranks of a node never race over the same files."""
    prune(root, rank, None, source, strays)
    try:
        os.rmdir(root)
    except FileNotFoundError:
        return True
    except OSError:  # another rank's parts are still there, or it cannot be removed now
        return False
    return True

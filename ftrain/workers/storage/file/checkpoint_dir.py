"""A checkpoint directory on a file system (local, NFS, Lustre, GPFS): assemble it, seal it, verify it, set it
aside.

Names come from workers.layout. A checkpoint is assembled in a hidden directory and renamed into place, so its
step directory either does not exist or holds a complete checkpoint; two writers of the same step cannot both
succeed. Towards the log a checkpoint is identified by its `checkpoint_hash`, the bare hex SHA-256 of its
manifest bytes; this module converts it to and from the stored digests.
"""

import os
import socket
import uuid
from pathlib import Path

import msgspec
import structlog

from ftrain.domain.lifecycle import OnDisk
from ftrain.host.atomic_file import fsync_dir, write_atomic
from ftrain.host.nofollow import remove_dir, rename_entry
from ftrain.host.private_files import DIR_MODE, private_dir
from ftrain.host.processes import pid_alive
from ftrain.workers.durable_files import copy_hashing, write_file
from ftrain.workers.integrity import ALGORITHM, digest_of, to_hex
from ftrain.workers.layout import (
    MANIFEST,
    MARKER,
    RESERVED,
    SetAsideKind,
    assemblies,
    assembly_dir,
    assembly_writer,
    complete_steps,
    process_writer,
    set_aside_path,
    step_dir,
)
from ftrain.workers.manifest import (
    FileEntry,
    Manifest,
    Marker,
    decode_manifest,
    decode_marker,
    encode_manifest,
    entry_of,
)
from ftrain.workers.storage.location import path_uri, uri_path
from ftrain.workers.storage.port import StoredCheckpoint
from ftrain.workers.storage.storage_errors import CheckpointExists, StorageError, StorageUnavailable
from ftrain.workers.storage.verdict import absent, judge_manifest, unavailable, verify_files

log = structlog.get_logger(__name__)


def confined(uri: str, run: Path) -> Path | None:
    """The checkpoint directory `uri` names, when it resolves (symlinks resolved) to a directory directly
    under the run's directory `run`, under its own name; None otherwise. The one test a URI from the log or
    from a listing must pass before any of its bytes is read or it is moved: a forged event may point
    anywhere. Raises StorageUnavailable when `run` cannot be listed (out of reach is never "outside")."""
    try:
        path = uri_path(uri)
    except StorageError:
        return None
    if path.name and path.resolve() == run.resolve() / path.name:
        return run / path.name
    require_listable(run)
    return None


def begin_assembly(run: Path, step: int) -> Path:
    """A fresh assembly directory of `step` named for this process (a writer outside the trainer's
    attempts): CheckpointExists when the step is sealed; what writers on this host left when they died
    mid-write is removed first."""
    final = step_dir(run, step)
    if final.exists():
        raise CheckpointExists(f"{final} already exists")
    remove_dead_assemblies(run)
    tmp = assembly_dir(run, step, process_writer(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8]))
    private_dir(run, tighten=False)
    tmp.mkdir(mode=DIR_MODE)
    return tmp


def write_source(assembly: Path, name: str, src: bytes | Path, algorithm: str = ALGORITHM) -> FileEntry:
    """Write (or copy) one data file into an assembly directory, fsync'd and hashed (with `algorithm`) on the
    way."""
    if Path(name).is_absolute() or ".." in Path(name).parts or name in RESERVED:
        raise StorageError(f"checkpoint file name {name!r} is not allowed")
    dst = assembly / name
    private_dir(dst.parent, tighten=False)
    hashed = write_file(dst, src, algorithm) if isinstance(src, bytes) else copy_hashing(src, dst, algorithm)
    return entry_of(name, hashed)


def remove_dead_assemblies(run: Path) -> list[Path]:
    """Remove the assembly directories that writers on this host left when they died mid-write; a live
    writer's, another host's and the trainer's are left alone. Returns what was removed."""
    host, removed = socket.gethostname(), []
    for path in assemblies(run):
        writer = assembly_writer(path)
        if writer is not None and writer[0] == host and not pid_alive(writer[1]):
            try:
                if remove_dir(run, path.name, unlink_link=True):
                    removed.append(path)
            except OSError as exc:
                log.warning("assembly_not_removed", path=str(path), error=str(exc))
    return removed


def seal_checkpoint(tmp: Path, final: Path, manifest: Manifest, attempt: int = 0) -> StoredCheckpoint:
    """Finish an assembled directory whose data files are in place: manifest, marker (atomically, last;
    naming the `attempt` that sealed it), then rename it to `final`. The caller removes `tmp` if this raises."""
    raw = encode_manifest(manifest)
    write_file(tmp / MANIFEST, raw)
    manifest_digest = digest_of(raw)
    write_atomic(tmp / MARKER, msgspec.json.encode(Marker(manifest_digest, manifest.step, attempt)))
    try:
        os.rename(tmp, final)
    except OSError as exc:
        raise CheckpointExists(f"{final} already exists") from exc
    fsync_dir(final.parent)
    return StoredCheckpoint(path_uri(final), decode_manifest(raw), to_hex(manifest_digest))


def on_disk(run: Path) -> list[OnDisk]:
    """The run's complete step directories, newest first, each with the log-form hash its marker claims.
    Raises StorageUnavailable when the run directory is there but cannot be listed."""
    try:
        steps = complete_steps(run)
    except OSError as exc:
        raise unavailable(run, exc) from exc
    return [OnDisk(step, path_uri(step_dir(run, step)), marker_hash(step_dir(run, step))) for step in steps]


def require_listable(run: Path) -> None:
    """Raise StorageUnavailable unless the run directory can be listed. Where the log records checkpoints,
    a missing or unreadable run directory means the storage is out of reach, never that they are gone: it
    must not be created afresh (that would turn an unmounted file system into "directory missing")."""
    try:
        os.scandir(run).close()
    except OSError as exc:
        raise unavailable(run, exc) from exc


def verify_checkpoint(
    path: Path, expected_hash: str, *, run_id: str | None = None, step: int | None = None
) -> str | None:
    """None when the checkpoint at `path` is valid for the log's `expected_hash` (and, when given, is the
    checkpoint of `run_id` at `step`), else why it is not. Raises StorageUnavailable."""
    manifest = read_manifest(path, expected_hash, run_id=run_id, step=step)
    if isinstance(manifest, str):
        return manifest
    return verify_files(path, manifest.files)


def marker_hash(path: Path) -> str | None:
    """The checkpoint hash its completion marker claims (what identifies it when the log is out of reach);
    None when the marker is missing or unreadable."""
    try:
        marker = _read_marker(path)
    except StorageUnavailable:
        return None
    return None if isinstance(marker, str) else to_hex(marker.manifest_digest)


def read_manifest(
    path: Path, expected_hash: str | None, *, run_id: str | None = None, step: int | None = None
) -> Manifest | str:
    """The checkpoint's manifest if its marker and digest check out (against the log's `expected_hash`, or
    the marker's own when None: the log is out of reach) and it names `run_id` and `step` (when given: a
    checkpoint copied from another run or step is not the one the event recorded), else why not. Files are
    not read. Raises StorageUnavailable: a missing run directory or an I/O error says nothing about the
    checkpoint."""
    try:
        os.scandir(path).close()
    except OSError as exc:
        return absent(path, path.parent, exc, "directory missing")
    marker = _read_marker(path)
    if isinstance(marker, str):
        return marker
    try:
        raw = (path / MANIFEST).read_bytes()
    except OSError as exc:
        return absent(path / MANIFEST, path, exc, "manifest missing")
    return judge_manifest(marker, raw, expected_hash, run_id=run_id, step=step)


def _read_marker(path: Path) -> Marker | str:
    try:
        return decode_marker((path / MARKER).read_bytes())
    except OSError as exc:
        return absent(path / MARKER, path, exc, "completion marker missing")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "completion marker unreadable"


def set_aside(path: Path, kind: SetAsideKind, tag: str) -> Path | None:
    """Move a checkpoint out of the way under its set-aside name, freeing its step's name and keeping it as
    evidence; None if it is gone. The entry itself moves: a link is renamed, what it points at is not."""
    target = set_aside_path(path, kind, tag)
    return target if rename_entry(path.parent, path.name, target.name) else None

"""A checkpoint directory on a file system (local, NFS, Lustre, GPFS): write it whole, verify it, set it aside.

Names come from workers.layout. A checkpoint is assembled in a hidden directory and renamed into place, so its
step directory either does not exist or holds a complete checkpoint; two writers of the same step cannot both
succeed. Towards the log a checkpoint is identified by its `checkpoint_hash`, the bare hex SHA-256 of its
manifest bytes; this module converts it to and from the stored digests.
"""

import os
import shutil
import socket
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import msgspec
import structlog

from ftrain.events.atomic_file import fsync_dir, write_atomic
from ftrain.events.private import DIR_MODE, private_dir
from ftrain.host.processes import pid_alive
from ftrain.projections.lifecycle import OnDisk
from ftrain.workers.files import copy_hashing, write_file
from ftrain.workers.integrity import Hashed, digest_of, hash_files, to_hex
from ftrain.workers.layout import (
    MANIFEST,
    MARKER,
    RESERVED,
    SetAsideKind,
    assemblies,
    assembly_dir,
    assembly_writer,
    checkpoint_path,
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
)
from ftrain.workers.nofollow import remove_dir, rename_entry
from ftrain.workers.storage.errors import OUTSIDE_RUN as OUTSIDE_RUN
from ftrain.workers.storage.errors import CheckpointExists as CheckpointExists
from ftrain.workers.storage.errors import StorageError as StorageError
from ftrain.workers.storage.errors import StorageUnavailable as StorageUnavailable
from ftrain.workers.storage.verdict import entry_verdict, judge_manifest

log = structlog.get_logger(__name__)


class WrittenCheckpoint(msgspec.Struct, frozen=True):
    """A complete checkpoint: where it is, and the hash that identifies its manifest in the log."""

    path: Path
    uri: str
    manifest: Manifest
    checkpoint_hash: str


def storage_root(text: str) -> Path:
    """The directory behind a storage location: a path or a `file://` URI."""
    parsed = urlparse(text)
    if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):  # never drop a host silently
        raise StorageError(
            f"storage {text!r}: file:// on host {parsed.netloc!r} is not supported (use file:///path)"
        )
    if parsed.scheme in ("", "file"):
        try:  # a path the log cannot record as text, or whose escapes would decode to another path, is none
            name = unquote(parsed.path, errors="strict") if parsed.scheme else text
            name.encode()
        except UnicodeError:
            raise StorageError(f"storage {text!r}: not UTF-8 once its %-escapes are decoded") from None
        path = Path(name).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        return path
    raise StorageError(f"storage {text!r}: scheme {parsed.scheme!r} is not supported (use a path or file://)")


def path_uri(path: Path) -> str:
    """The `file://` URI of a path."""
    return path.absolute().as_uri()


def uri_path(uri: str) -> Path:
    """The path behind a `file://` URI."""
    return storage_root(uri)


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


def write_checkpoint(
    root: Path,
    *,
    run_id: str,
    step: int,
    epoch: int,
    shards: int,
    sources: Sequence[tuple[str, bytes | Path]],
    world_size: int = 1,
    dataset_revision: str | None = None,
    extra: dict[str, Any] | None = None,
) -> WrittenCheckpoint:
    """Write data files, manifest and marker, then rename the directory into place."""
    final = checkpoint_path(root, run_id, step)
    if final.exists():
        raise CheckpointExists(f"{final} already exists")
    remove_dead_assemblies(final.parent)
    tmp = assembly_dir(
        final.parent, step, process_writer(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8])
    )
    private_dir(tmp.parent, tighten=False)
    tmp.mkdir(mode=DIR_MODE)
    try:
        entries = [_write_source(tmp / name, src, name) for name, src in sources]
        manifest = Manifest(
            run_id=run_id,
            step=step,
            epoch=epoch,
            shards=shards,
            world_size=world_size,
            dataset_revision=dataset_revision,
            created_at=datetime.now(UTC),
            files=tuple(entries),
            extra=extra or {},
        )
        return seal_checkpoint(tmp, final, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


def seal_checkpoint(tmp: Path, final: Path, manifest: Manifest, attempt: int = 0) -> WrittenCheckpoint:
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
    return WrittenCheckpoint(final, path_uri(final), decode_manifest(raw), to_hex(manifest_digest))


def _write_source(dst: Path, src: bytes | Path, name: str) -> FileEntry:
    if Path(name).is_absolute() or ".." in Path(name).parts or name in RESERVED:
        raise StorageError(f"checkpoint file name {name!r} is not allowed")
    private_dir(dst.parent, tighten=False)
    hashed = write_file(dst, src) if isinstance(src, bytes) else copy_hashing(src, dst)
    return FileEntry(name, hashed.size, hashed.digest)


def on_disk(run: Path) -> list[OnDisk]:
    """The run's complete step directories, newest first, each with the log-form hash its marker claims.
    Raises StorageUnavailable when the run directory is there but cannot be listed."""
    try:
        steps = complete_steps(run)
    except OSError as exc:
        raise _unavailable(run, exc) from exc
    return [OnDisk(step, path_uri(step_dir(run, step)), marker_hash(step_dir(run, step))) for step in steps]


def require_listable(run: Path) -> None:
    """Raise StorageUnavailable unless the run directory can be listed. Where the log records checkpoints,
    a missing or unreadable run directory means the storage is out of reach, never that they are gone: it
    must not be created afresh (that would turn an unmounted file system into "directory missing")."""
    try:
        os.scandir(run).close()
    except OSError as exc:
        raise _unavailable(run, exc) from exc


def _unavailable(path: Path, exc: OSError) -> StorageUnavailable:
    return StorageUnavailable(f"storage unavailable: {path}: {exc.strerror or exc}")


def _listable(directory: Path) -> bool:
    try:
        with os.scandir(directory):
            return True
    except OSError:
        return False


def _absent(path: Path, anchor: Path, exc: OSError, verdict: str) -> str:
    """`verdict` when `path` is missing under `anchor`, a directory that can be listed (the checkpoint is
    incomplete); when `anchor` itself is out of reach, or the error is anything but absence (EIO, EACCES,
    ESTALE, a timeout), the storage is unavailable and StorageUnavailable is raised."""
    if isinstance(exc, FileNotFoundError | NotADirectoryError) and _listable(anchor):
        return verdict
    raise _unavailable(path, exc) from exc


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
        return _absent(path, path.parent, exc, "directory missing")
    marker = _read_marker(path)
    if isinstance(marker, str):
        return marker
    try:
        raw = (path / MANIFEST).read_bytes()
    except OSError as exc:
        return _absent(path / MANIFEST, path, exc, "manifest missing")
    return judge_manifest(marker, raw, expected_hash, run_id=run_id, step=step)


def _read_marker(path: Path) -> Marker | str:
    try:
        return decode_marker((path / MARKER).read_bytes())
    except OSError as exc:
        return _absent(path / MARKER, path, exc, "completion marker missing")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "completion marker unreadable"


def verify_files(path: Path, entries: Sequence[FileEntry]) -> str | None:
    """None when every listed file under `path` has its size and digest (hashed in threads), else why not.
    Raises StorageUnavailable when a file cannot be read for a reason other than its absence from `path`."""
    results = hash_files([path / f.name for f in entries])
    verdicts = (file_verdict(path, entry, result) for entry, result in zip(entries, results, strict=True))
    return next((v for v in verdicts if v), None)


def file_verdict(path: Path, entry: FileEntry, found: Hashed | OSError) -> str | None:
    """Why a file of the checkpoint at `path` does not match its manifest entry; None if it does. Raises
    StorageUnavailable for an error that is not the file's absence."""
    if isinstance(found, OSError):
        return _absent(path / entry.name, path, found, f"file {entry.name} missing")
    return entry_verdict(entry, found)


def set_aside(path: Path, kind: SetAsideKind, tag: str) -> Path | None:
    """Move a checkpoint out of the way under its set-aside name, freeing its step's name and keeping it as
    evidence; None if it is gone. The entry itself moves: a link is renamed, what it points at is not."""
    target = set_aside_path(path, kind, tag)
    return target if rename_entry(path.parent, path.name, target.name) else None


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint directory this process wrote and could not record."""
    try:
        remove_dir(path.parent, path.name)
    except OSError as exc:
        log.warning("checkpoint_not_removed", path=str(path), error=str(exc))

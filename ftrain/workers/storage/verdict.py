"""Whether a checkpoint's stored bytes are the ones its log event and manifest name: one judgement for every
backend, so a file system and an object store give the same reasons for the same damage; and, for a file read
from a local directory (a file system's step, a node's download cache), whether its absence is a defect or the
storage out of reach."""

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ftrain.workers.integrity import ALGORITHMS, Hashed, digest_of, from_hex, hash_files
from ftrain.workers.manifest import FileEntry, Manifest, Marker, decode_manifest
from ftrain.workers.storage.storage_errors import StorageUnavailable


def judge_manifest(
    marker: Marker, raw: bytes, expected_hash: str | None, *, run_id: str | None, step: int | None
) -> Manifest | str:
    """The manifest in `raw` when its digest is the log's `expected_hash` (or the marker's own when None:
    the log is out of reach), the marker agrees, it names `run_id` and `step` (when given) and every data
    file's digest names an algorithm this ftrain hashes with; else why not."""
    try:
        manifest = decode_manifest(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "manifest unreadable"
    actual = digest_of(raw)
    if actual != (from_hex(expected_hash) if expected_hash else marker.manifest_digest):
        return "hash mismatch"
    if marker.manifest_digest != actual:
        return "completion marker does not match the manifest"
    if (run_id is not None and manifest.run_id != run_id) or (step is not None and manifest.step != step):
        return f"manifest is run {manifest.run_id} step {manifest.step}, expected run {run_id} step {step}"
    for entry in manifest.files:
        if entry.algorithm not in ALGORITHMS:
            return (
                f"file {entry.name} names digest algorithm {entry.algorithm!r}, unknown to this ftrain "
                f"(it checks {', '.join(ALGORITHMS)})"
            )
        if reason := chunks_verdict(entry):
            return reason
    return manifest


def chunks_verdict(entry: FileEntry) -> str | None:
    """Why an entry's chunk digests cannot cover its file (a chunk size without them, or too many or too
    few for its size); None when they can, or it lists none."""
    if entry.chunk_size < 0 or (entry.chunks and not entry.chunk_size):
        return f"file {entry.name} lists chunk digests of {entry.chunk_size} bytes"
    if entry.chunked and len(entry.chunks) != -(-entry.size // entry.chunk_size):
        return f"file {entry.name} lists {len(entry.chunks)} chunk digests for {entry.size} bytes"
    return None


def entry_verdict(entry: FileEntry, found: Hashed) -> str | None:
    """Why the bytes found for a file do not match its manifest entry; None when they do."""
    if found.size != entry.size:
        return f"file {entry.name} is {found.size} bytes, manifest says {entry.size}"
    if found.digest != entry.digest:
        return f"file {entry.name} hash mismatch"
    return None


def unavailable(path: Path, exc: OSError) -> StorageUnavailable:
    """The storage out of reach, as a local path's error says."""
    return StorageUnavailable(f"storage unavailable: {path}: {exc.strerror or exc}")


def _listable(directory: Path) -> bool:
    try:
        with os.scandir(directory):
            return True
    except OSError:
        return False


def absent(path: Path, anchor: Path, exc: OSError, verdict: str) -> str:
    """`verdict` when `path` is missing under `anchor`, a directory that can be listed (the checkpoint is
    incomplete); when `anchor` itself is out of reach, or the error is anything but absence (EIO, EACCES,
    ESTALE, a timeout), the storage is unavailable and StorageUnavailable is raised."""
    if isinstance(exc, FileNotFoundError | NotADirectoryError) and _listable(anchor):
        return verdict
    raise unavailable(path, exc) from exc


def file_verdict(path: Path, entry: FileEntry, found: Hashed | OSError) -> str | None:
    """Why a file of the checkpoint at `path` does not match its manifest entry; None if it does. Raises
    StorageUnavailable for an error that is not the file's absence."""
    if isinstance(found, OSError):
        return absent(path / entry.name, path, found, f"file {entry.name} missing")
    return entry_verdict(entry, found)


def verify_files(path: Path, entries: Sequence[FileEntry]) -> str | None:
    """None when every listed file under `path` has its size and digest (hashed in threads, each with the
    algorithm its entry names), else why not.
    Raises StorageUnavailable when a file cannot be read for a reason other than its absence from `path`."""
    results = hash_files([(path / f.name, f.algorithm) for f in entries])
    verdicts = (file_verdict(path, entry, result) for entry, result in zip(entries, results, strict=True))
    return next((v for v in verdicts if v), None)

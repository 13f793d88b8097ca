"""Whether a checkpoint's stored bytes are the ones its log event and manifest name: one judgement for every
backend, so a file system and an object store give the same reasons for the same damage."""

import msgspec

from ftrain.workers.integrity import Hashed, digest_of, from_hex
from ftrain.workers.manifest import FileEntry, Manifest, Marker, decode_manifest


def judge_manifest(
    marker: Marker, raw: bytes, expected_hash: str | None, *, run_id: str | None, step: int | None
) -> Manifest | str:
    """The manifest in `raw` when its digest is the log's `expected_hash` (or the marker's own when None:
    the log is out of reach), the marker agrees, and it names `run_id` and `step` (when given); else why not."""
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
    return manifest


def entry_verdict(entry: FileEntry, found: Hashed) -> str | None:
    """Why the bytes found for a file do not match its manifest entry; None when they do."""
    if found.size != entry.size:
        return f"file {entry.name} is {found.size} bytes, manifest says {entry.size}"
    if found.digest != entry.digest:
        return f"file {entry.name} hash mismatch"
    return None

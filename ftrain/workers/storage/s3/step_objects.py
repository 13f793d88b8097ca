"""A run's steps in a bucket (AWS S3 or any S3-compatible store), through boto3: the bucket-side work of the S3
backend (`run_prefix.S3Run`), as `file/checkpoint_dir.py` is the file system's. Each function takes the
`Bucket` and the run's key prefix (`workers.layout.run_key`) or a step's URI.

There is no rename, so a step is sealed in place under `<prefix>/<run_id>/step-<N>/` (names: `workers.layout`):

1. claim: `step-<N>/.writer` with a conditional PutObject (`If-None-Match: *`) naming host, pid and a nonce: of
   two writers of one step exactly one gets it; the other is refused before it uploads a byte (412);
2. the data files (multipart for large ones, in TransferConfig's parts: uploaded from local files, or streamed
   from memory as DCP writes them, `dcp_stream`), each hashed by ftrain as its bytes go to the store, never
   read twice; then `manifest.json`;
3. the completion marker `.complete` as ONE conditional PutObject (`If-None-Match: *`): a step is absent or
   complete, never overwritten (412 → refused; a 409 conflict with a write in flight is retried). The claim
   stays in the sealed step, so a late writer of the same step is refused at its claim, before it uploads.

A step without a marker is partial work: `partial.clean` removes it (and aborts the run's multipart uploads in
it) when no live writer owns it — no claim, or a claim by a process of this host that is gone; another host's
is left alone, as on a file system. Quarantine copies the step's objects to `step-<N>.<kind>-<tag>/`
(server-side CopyObject), then deletes the marker first and the rest in batches (DeleteObjects), so an
interrupted move leaves an unmarked step that `clean` finishes. Deletes go in batches of 1,000 keys.

Errors: an object that is not there (NoSuchKey, 404) in a bucket that answers is a checkpoint defect; anything
else — an unreachable endpoint, a timeout, 5xx, AccessDenied, bad credentials, NoSuchBucket — is
`StorageUnavailable`, naming the server's reason.
"""

from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

import msgspec
import structlog

from ftrain.domain.lifecycle import OnDisk
from ftrain.workers.integrity import ALGORITHM, Hashed, digest_of, to_hex
from ftrain.workers.layout import (
    MANIFEST,
    MARKER,
    RESERVED,
    WRITER_CLAIM,
    SetAsideKind,
    parse_step,
    set_aside_name,
    step_name,
)
from ftrain.workers.manifest import (
    FileEntry,
    Manifest,
    Marker,
    decode_manifest,
    decode_marker,
    encode_manifest,
)
from ftrain.workers.storage.port import StoredCheckpoint
from ftrain.workers.storage.s3.bucket import Bucket, ObjectMissing
from ftrain.workers.storage.s3.partial import claim_body, clean
from ftrain.workers.storage.s3.ranged import fetch_files
from ftrain.workers.storage.storage_errors import CheckpointExists, StorageError, StorageUnavailable
from ftrain.workers.storage.verdict import entry_verdict, judge_manifest

log = structlog.get_logger(__name__)

VERIFY_THREADS: Final = 8


def step_uri(bucket: Bucket, run_key: str, step: int) -> str:
    """The URI of `step` of the run under `run_key`."""
    return bucket.uri(run_key + step_name(step))


def step_key(bucket: Bucket, uri: str) -> str:
    """The key prefix (ending in '/') of a step URI of this bucket."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or parsed.netloc != bucket.name or not parsed.path.strip("/"):
        raise StorageError(f"{uri!r} is not a checkpoint in s3://{bucket.name}")
    return parsed.path.strip("/") + "/"


# -- write -----------------------------------------------------------------------------------------------------

# The write in parts, for a writer whose data files come from several processes (the trainer's ranks): one
# process claims the step (`begin`), each uploads its own files (`upload`), one seals (`seal`) once every upload
# is in; a failure anywhere discards the step (`discard`), so nothing is sealed.


def begin(bucket: Bucket, run_key: str, step: int) -> str:
    """Claim `step` of the run for this writer (after removing the run's stale partial work); its URI.
    CheckpointExists when the step is sealed or another writer claimed it."""
    key = run_key + step_name(step) + "/"
    uri = bucket.uri(key)
    bucket.reach(key)  # a missing bucket or refused key is named by the server before anything else
    if bucket.exists(key + MARKER):
        raise CheckpointExists(f"{uri} already exists")
    clean(bucket, run_key)
    if not bucket.put_if_absent(key + WRITER_CLAIM, claim_body()):
        raise CheckpointExists(f"{uri} already exists (another writer claimed it)")
    return uri


def upload(
    bucket: Bucket,
    uri: str,
    name: str,
    src: bytes | Path,
    known: Hashed | None = None,
    algorithm: str = ALGORITHM,
) -> FileEntry:
    """Upload one data file of the claimed step at `uri` (multipart when large), hashing its bytes (by
    `algorithm`) as they stream (one read). With `known` — the digest its writer computed while writing the
    local file — the file is not hashed again: its parts are read and sent in parallel (each with its CRC32,
    checked by the store on arrival) and the stored object must have the known size, else StorageError. A
    local file changed between its write and its upload would then be caught by the full verification every
    resume does (each file against its digest), not here: the cost of a second hash on the save path is a
    third of the upload here."""
    if name.startswith("/") or ".." in name.split("/") or name in RESERVED or name == WRITER_CLAIM:
        raise StorageError(f"checkpoint file name {name!r} is not allowed")
    key = step_key(bucket, uri) + name
    if isinstance(src, bytes):
        bucket.put(key, src)
        entry = FileEntry(name, len(src), digest_of(src, algorithm))
    elif known is not None:
        bucket.send(key, src)
        entry = FileEntry(name, known.size, known.digest)
    else:
        hashed = bucket.upload(key, src, algorithm)
        entry = FileEntry(name, hashed.size, hashed.digest)
    if known is not None:
        if entry.digest != known.digest:
            raise StorageError(f"{name} changed between its write and its upload")
        stored = bucket.size(key)
        if stored != known.size:
            raise StorageError(f"s3://{bucket.name}/{key}: stored {stored} bytes, sent {known.size}")
    return entry


def seal(bucket: Bucket, uri: str, manifest: Manifest) -> StoredCheckpoint:
    """Write the manifest, then the marker (one conditional put): the step is complete. CheckpointExists when
    a marker is there already (the claim was taken from this writer)."""
    key = step_key(bucket, uri)
    raw = encode_manifest(manifest)
    bucket.put(key + MANIFEST, raw)
    digest = digest_of(raw)
    marker = msgspec.json.encode(Marker(digest, manifest.step, 0))
    if not bucket.put_if_absent(key + MARKER, marker):
        raise CheckpointExists(f"{uri} already exists (another writer sealed it)")
    return StoredCheckpoint(uri, decode_manifest(raw), to_hex(digest))


def discard(bucket: Bucket, uri: str) -> None:
    """Remove what a failed write of ours left under `uri` (best effort: `clean` finishes the rest)."""
    key = step_key(bucket, uri)
    try:
        bucket.delete(bucket.keys(key))
    except StorageUnavailable as exc:
        log.warning("partial_step_not_removed", prefix=key, error=str(exc))


# -- read ------------------------------------------------------------------------------------------------------


def complete(bucket: Bucket, run_key: str) -> list[OnDisk]:
    """The run's sealed steps, newest first, each with the hash its marker claims (unverified)."""
    bucket.reach(run_key)
    found: list[OnDisk] = []
    for name in bucket.children(run_key):
        step = parse_step(name)
        if step is None:
            continue
        marker = _marker(bucket, run_key + name + "/")
        if isinstance(marker, Marker):
            found.append(OnDisk(step, bucket.uri(run_key + name), to_hex(marker.manifest_digest)))
    return sorted(found, key=lambda d: d.step, reverse=True)


def _marker(bucket: Bucket, key: str) -> Marker | str:
    try:
        return decode_marker(bucket.get(key + MARKER))
    except ObjectMissing:
        return "completion marker missing"
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "completion marker unreadable"


def confined(bucket: Bucket, uri: str, run_key: str) -> str | None:
    """`uri` when it names a step directly under the run's key prefix in this bucket, else None."""
    parsed = urlparse(uri)
    key = parsed.path[1:] if parsed.path.startswith("/") else ""
    name = key[len(run_key) :] if key.startswith(run_key) else ""
    if (
        parsed.scheme != "s3"
        or parsed.netloc != bucket.name
        or parsed.query
        or parsed.fragment
        or not name
        or "/" in name
        or name in (".", "..")
    ):
        return None
    return bucket.uri(run_key + name)


def read_manifest(
    bucket: Bucket, uri: str, expected_hash: str | None, *, run_id: str | None = None, step: int | None = None
) -> Manifest | str:
    """The checkpoint's manifest when its marker and digest check out, else why not (as on a file system)."""
    key = step_key(bucket, uri)
    bucket.reach(key)
    marker = _marker(bucket, key)
    if isinstance(marker, str):
        if marker == "completion marker missing" and not bucket.keys(key):
            return "directory missing"
        return marker
    try:
        raw = bucket.get(key + MANIFEST)
    except ObjectMissing:
        return "manifest missing"
    return judge_manifest(marker, raw, expected_hash, run_id=run_id, step=step)


def verify(
    bucket: Bucket, uri: str, expected_hash: str, *, run_id: str | None = None, step: int | None = None
) -> str | None:
    """None when the step at `uri` is valid for the log's hash, every object hashed as it streams in (in
    threads, nothing kept); else why not."""
    manifest = read_manifest(bucket, uri, expected_hash, run_id=run_id, step=step)
    if isinstance(manifest, str):
        return manifest
    key = step_key(bucket, uri)
    with ThreadPoolExecutor(min(VERIFY_THREADS, max(1, len(manifest.files)))) as pool:
        found = list(pool.map(lambda e: bucket.hashed(key + e.name, e.algorithm), manifest.files))
    for entry, hashed in zip(manifest.files, found, strict=True):
        verdict = f"file {entry.name} missing" if hashed is None else entry_verdict(entry, hashed)
        if verdict:
            return verdict
    return None


def fetch(bucket: Bucket, uri: str, files: Sequence[FileEntry], into: Path) -> str | None:
    """Download `files` of the checkpoint at `uri` into the private directory `into` in parallel ranged reads
    (`workers.storage.s3.ranged`), each file hashed in order as its bytes arrive and written as they pass
    (never read twice); None when every file matches its manifest entry, else the first reason one does not.
    No byte is parsed here. Raises StorageUnavailable."""
    return fetch_files(bucket.client, bucket.name, step_key(bucket, uri), files, into)


# -- move and remove -------------------------------------------------------------------------------------------


def prune(bucket: Bucket, run_key: str, steps: Collection[int]) -> list[int]:
    """Retention: delete the run's sealed steps of `steps` (`workers.layout.retire` decides which); returns the
    deleted steps. Set-aside prefixes are evidence and never touched."""
    removed = []
    for old in (found for found in complete(bucket, run_key) if found.step in steps):
        bucket.delete(bucket.keys(step_key(bucket, old.uri)))
        removed.append(old.step)
        log.info("checkpoint_pruned", step=old.step, uri=old.uri)
    return removed


def quarantine(bucket: Bucket, uri: str, kind: SetAsideKind, tag: str) -> str | None:
    """Copy the step aside under its set-aside name (kept as evidence), then delete it, freeing its name; the
    new URI, None if it was gone."""
    key = step_key(bucket, uri)
    keys = bucket.keys(key)
    if not keys:
        return None
    parent, name = key.rstrip("/").rpartition("/")[::2]
    target = (f"{parent}/" if parent else "") + set_aside_name(name, kind, tag) + "/"
    for each in keys:
        bucket.copy(each, target + each[len(key) :])
    bucket.delete(keys)
    return bucket.uri(target)

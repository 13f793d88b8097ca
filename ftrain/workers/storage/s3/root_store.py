"""Checkpoints under a storage root on S3 (AWS S3 or any S3-compatible store), through boto3: the bucket-side
work of the S3 backend (`run_prefix.S3Run`).

There is no rename, so a step is sealed in place under `<prefix>/<run_id>/step-<N>/` (names: `workers.layout`):

1. claim: `step-<N>/.writer` with a conditional PutObject (`If-None-Match: *`) naming host, pid and a nonce: of
   two writers of one step exactly one gets it; the other is refused before it uploads a byte (412);
2. the data files (multipart for large ones, through boto3's TransferConfig), each hashed by ftrain as its bytes
   stream to the store, never read twice; then `manifest.json`;
3. the completion marker `.complete` as ONE conditional PutObject (`If-None-Match: *`): a step is absent or
   complete, never overwritten (412 → refused; a 409 conflict with a write in flight is retried). The claim
   stays in the sealed step, so a late writer of the same step is refused at its claim, before it uploads.

A step without a marker is partial work: `clean` removes it (and aborts the run's multipart uploads in it) when
no live writer owns it — no claim, or a claim by a process of this host that is gone; another host's is left
alone, as on a file system. Quarantine copies the step's objects to `step-<N>.<kind>-<tag>/` (server-side
CopyObject), then deletes the marker first and the rest in batches (DeleteObjects), so an interrupted move
leaves an unmarked step that `clean` finishes. Deletes go in batches of 1,000 keys.

Errors: an object that is not there (NoSuchKey, 404) in a bucket that answers is a checkpoint defect; anything
else — an unreachable endpoint, a timeout, 5xx, AccessDenied, bad credentials, NoSuchBucket — is
`StorageUnavailable`, naming the server's reason.
"""

from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlparse

import msgspec
import structlog

from ftrain.domain.lifecycle import OnDisk
from ftrain.workers.integrity import Hashed, digest_of, to_hex
from ftrain.workers.layout import (
    MANIFEST,
    MARKER,
    RESERVED,
    WRITER_CLAIM,
    SetAsideKind,
    parse_step,
    run_key,
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


class S3Storage:
    """Checkpoints under `s3://bucket/prefix`."""

    def __init__(self, bucket: str, prefix: str, client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.objects = Bucket(bucket, client)

    @property
    def client(self) -> Any:
        """The boto3 client, made on first use (from the standard AWS chain)."""
        return self.objects.client

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    # -- names ---------------------------------------------------------------------------------------------

    def _run_key(self, run_id: str) -> str:
        return run_key(self.prefix, run_id)

    def step_uri(self, run_id: str, step: int) -> str:
        """The URI of `step` of the run."""
        return self.objects.uri(self._run_key(run_id) + step_name(step))

    def _step_key(self, uri: str) -> str:
        """The key prefix (ending in '/') of a step URI of this bucket."""
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or parsed.netloc != self.bucket or not parsed.path.strip("/"):
            raise StorageError(f"{uri!r} is not a checkpoint in s3://{self.bucket}")
        return parsed.path.strip("/") + "/"

    # -- write ---------------------------------------------------------------------------------------------

    # The write in parts, for a writer whose data files come from several processes (the trainer's ranks):
    # one process claims the step (`begin`), each uploads its own files (`upload`), one seals (`seal`) once
    # every upload is in; a failure anywhere discards the step (`discard`), so nothing is sealed.

    def begin(self, run_id: str, step: int) -> str:
        """Claim `step` of the run for this writer (after removing the run's stale partial work); its URI.
        CheckpointExists when the step is sealed or another writer claimed it."""
        step_key = self._run_key(run_id) + step_name(step) + "/"
        uri = self.objects.uri(step_key)
        self.objects.reach(
            step_key
        )  # a missing bucket or refused key is named by the server before anything else
        if self.objects.exists(step_key + MARKER):
            raise CheckpointExists(f"{uri} already exists")
        self.clean(run_id)
        if not self.objects.put_if_absent(step_key + WRITER_CLAIM, claim_body()):
            raise CheckpointExists(f"{uri} already exists (another writer claimed it)")
        return uri

    def upload(self, uri: str, name: str, src: bytes | Path, known: Hashed | None = None) -> FileEntry:
        """Upload one data file of the claimed step at `uri` (multipart when large), hashing its bytes as they
        stream (one read). With `known` — the digest its writer computed while writing the local file — the
        file is not hashed again: its parts are read and sent in parallel (each with its CRC32, checked by the
        store on arrival) and the stored object must have the known size, else StorageError. A local file
        changed between its write and its upload would then be caught by the full SHA-256 verification every
        resume does, not here: the cost of a second hash on the save path is a third of the upload here."""
        if name.startswith("/") or ".." in name.split("/") or name in RESERVED or name == WRITER_CLAIM:
            raise StorageError(f"checkpoint file name {name!r} is not allowed")
        key = self._step_key(uri) + name
        if isinstance(src, bytes):
            self.objects.put(key, src)
            entry = FileEntry(name, len(src), digest_of(src))
        elif known is not None:
            self.objects.send(key, src)
            entry = FileEntry(name, known.size, known.digest)
        else:
            hashed = self.objects.upload(key, src)
            entry = FileEntry(name, hashed.size, hashed.digest)
        if known is not None:
            if entry.digest != known.digest:
                raise StorageError(f"{name} changed between its write and its upload")
            stored = self.objects.size(key)
            if stored != known.size:
                raise StorageError(f"s3://{self.bucket}/{key}: stored {stored} bytes, sent {known.size}")
        return entry

    def seal(self, uri: str, manifest: Manifest) -> StoredCheckpoint:
        """Write the manifest, then the marker (one conditional put): the step is complete. CheckpointExists
        when a marker is there already (the claim was taken from this writer)."""
        step_key = self._step_key(uri)
        raw = encode_manifest(manifest)
        self.objects.put(step_key + MANIFEST, raw)
        digest = digest_of(raw)
        marker = msgspec.json.encode(Marker(digest, manifest.step, 0))
        if not self.objects.put_if_absent(step_key + MARKER, marker):
            raise CheckpointExists(f"{uri} already exists (another writer sealed it)")
        return StoredCheckpoint(uri, decode_manifest(raw), to_hex(digest))

    def discard(self, uri: str) -> None:
        """Remove what a failed write of ours left under `uri` (best effort: `clean` finishes the rest)."""
        self._discard(self._step_key(uri))

    def _discard(self, step_key: str) -> None:
        """Remove what a failed write of ours left (best effort: `clean` finishes what this cannot)."""
        try:
            self.objects.delete(self.objects.keys(step_key))
        except StorageUnavailable as exc:
            log.warning("partial_step_not_removed", prefix=step_key, error=str(exc))

    # -- read ----------------------------------------------------------------------------------------------

    def complete(self, run_id: str) -> list[OnDisk]:
        run_key = self._run_key(run_id)
        self.objects.reach(run_key)
        found: list[OnDisk] = []
        for name in self.objects.children(run_key):
            step = parse_step(name)
            if step is None:
                continue
            marker = self._marker(run_key + name + "/")
            if isinstance(marker, Marker):
                found.append(OnDisk(step, self.objects.uri(run_key + name), to_hex(marker.manifest_digest)))
        return sorted(found, key=lambda d: d.step, reverse=True)

    def _marker(self, step_key: str) -> Marker | str:
        try:
            return decode_marker(self.objects.get(step_key + MARKER))
        except ObjectMissing:
            return "completion marker missing"
        except (msgspec.DecodeError, msgspec.ValidationError):
            return "completion marker unreadable"

    def confined(self, uri: str, run_id: str) -> str | None:
        parsed = urlparse(uri)
        run_key = self._run_key(run_id)
        key = parsed.path[1:] if parsed.path.startswith("/") else ""
        name = key[len(run_key) :] if key.startswith(run_key) else ""
        if (
            parsed.scheme != "s3"
            or parsed.netloc != self.bucket
            or parsed.query
            or parsed.fragment
            or not name
            or "/" in name
            or name in (".", "..")
        ):
            return None
        return self.objects.uri(run_key + name)

    def read_manifest(
        self, uri: str, expected_hash: str | None, *, run_id: str | None = None, step: int | None = None
    ) -> Manifest | str:
        """The checkpoint's manifest when its marker and digest check out, else why not (as on a file system)."""
        step_key = self._step_key(uri)
        self.objects.reach(step_key)
        marker = self._marker(step_key)
        if isinstance(marker, str):
            if marker == "completion marker missing" and not self.objects.keys(step_key):
                return "directory missing"
            return marker
        try:
            raw = self.objects.get(step_key + MANIFEST)
        except ObjectMissing:
            return "manifest missing"
        return judge_manifest(marker, raw, expected_hash, run_id=run_id, step=step)

    def verify(
        self, uri: str, expected_hash: str, *, run_id: str | None = None, step: int | None = None
    ) -> str | None:
        manifest = self.read_manifest(uri, expected_hash, run_id=run_id, step=step)
        if isinstance(manifest, str):
            return manifest
        step_key = self._step_key(uri)
        with ThreadPoolExecutor(min(VERIFY_THREADS, max(1, len(manifest.files)))) as pool:
            found = list(pool.map(lambda e: self.objects.hashed(step_key + e.name), manifest.files))
        for entry, hashed in zip(manifest.files, found, strict=True):
            verdict = f"file {entry.name} missing" if hashed is None else entry_verdict(entry, hashed)
            if verdict:
                return verdict
        return None

    def fetch(self, uri: str, files: Sequence[FileEntry], into: Path) -> str | None:
        """Download `files` of the checkpoint at `uri` into the private directory `into` in parallel ranged
        reads (`workers.storage.s3.ranged`), each file hashed in order as its bytes arrive and written as they pass
        (never read twice); None when every file matches its manifest entry, else the first reason one does
        not. No byte is parsed here. Raises StorageUnavailable."""
        return fetch_files(self.client, self.bucket, self._step_key(uri), files, into)

    def prune(self, run_id: str, steps: Collection[int]) -> list[int]:
        """Retention: delete the run's sealed steps of `steps` (`workers.layout.retire` decides which);
        returns the deleted steps. Set-aside prefixes are evidence and never touched."""
        removed = []
        for old in (found for found in self.complete(run_id) if found.step in steps):
            self.objects.delete(self.objects.keys(self._step_key(old.uri)))
            removed.append(old.step)
            log.info("checkpoint_pruned", step=old.step, uri=old.uri)
        return removed

    # -- move and remove -----------------------------------------------------------------------------------

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        step_key = self._step_key(uri)
        keys = self.objects.keys(step_key)
        if not keys:
            return None
        parent, name = step_key.rstrip("/").rpartition("/")[::2]
        target = (f"{parent}/" if parent else "") + set_aside_name(name, kind, tag) + "/"
        for key in keys:
            self.objects.copy(key, target + key[len(step_key) :])
        self.objects.delete(keys)
        return self.objects.uri(target)

    def clean(self, run_id: str) -> list[str]:
        return clean(self.objects, self._run_key(run_id))

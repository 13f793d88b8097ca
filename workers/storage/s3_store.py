"""The S3 backend of the storage port (AWS S3 or any S3-compatible store), through boto3.

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

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlparse

import msgspec
import structlog
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from projections.lifecycle import OnDisk
from workers.integrity import CHUNK, Hashed, Hasher, digest_of, to_hex
from workers.layout import (
    MANIFEST,
    MARKER,
    RESERVED,
    WRITER_CLAIM,
    SetAsideKind,
    parse_step,
    set_aside_name,
    step_name,
)
from workers.manifest import FileEntry, Manifest, Marker, decode_manifest, decode_marker, encode_manifest
from workers.s3.client import CONFLICT, PRECONDITION_FAILED, error_code, is_missing, make_client, reason
from workers.s3.ranged import fetch_files
from workers.storage.errors import CheckpointExists, StorageError, StorageUnavailable
from workers.storage.port import Source, StoredCheckpoint
from workers.storage.verdict import entry_verdict, judge_manifest

T = TypeVar("T")
log = structlog.get_logger(__name__)

TRANSFER: Final = TransferConfig(
    multipart_threshold=64 << 20, multipart_chunksize=16 << 20, max_concurrency=8, use_threads=True
)
"""Files over 64 MiB go up in 16 MiB parts, 8 at a time."""
DELETE_BATCH: Final = 1000
CONFLICT_RETRIES: Final = 5
VERIFY_THREADS: Final = 8


class _Missing(Exception):
    """The object is not there."""


class Claim(msgspec.Struct, frozen=True):
    """Who is writing a step: the body of its `.writer` object."""

    host: str
    pid: int
    nonce: str
    time: float


def parse_s3_uri(text: str) -> tuple[str, str]:
    """(bucket, prefix without surrounding slashes) of `s3://bucket[/prefix]`."""
    parsed = urlparse(text)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    if parsed.scheme != "s3" or len(bucket) < 3 or parsed.query or parsed.fragment:
        raise StorageError(
            f"storage {text!r}: expected s3://bucket[/prefix] (a bucket name has 3+ characters)"
        )
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise StorageError(f"storage {text!r}: the prefix has an empty, '.' or '..' segment")
    return bucket, prefix


class _HashingReader:
    """A file read once, front to back, hashed as boto3 takes its bytes. No seek: boto3 then buffers each part
    it sends, so a retried part is re-sent from memory, never re-read (and never hashed twice)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.hasher = Hasher()

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._f.read(size)
        self.hasher.update(data)
        return data


class S3Storage:
    """Checkpoints under `s3://bucket/prefix`."""

    def __init__(self, bucket: str, prefix: str, client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self._client = client

    @property
    def client(self) -> Any:
        """The boto3 client, made on first use (from the standard AWS chain)."""
        if self._client is None:
            self._client = make_client()
        return self._client

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    # -- names ---------------------------------------------------------------------------------------------

    def _run_key(self, run_id: str) -> str:
        return f"{self.prefix}/{run_id}/" if self.prefix else f"{run_id}/"

    def step_uri(self, run_id: str, step: int) -> str:
        """The URI of `step` of the run."""
        return self._uri(self._run_key(run_id) + step_name(step))

    def _uri(self, key_prefix: str) -> str:
        return f"s3://{self.bucket}/{key_prefix.rstrip('/')}"

    def _step_key(self, uri: str) -> str:
        """The key prefix (ending in '/') of a step URI of this bucket."""
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or parsed.netloc != self.bucket or not parsed.path.strip("/"):
            raise StorageError(f"{uri!r} is not a checkpoint in s3://{self.bucket}")
        return parsed.path.strip("/") + "/"

    # -- calls ---------------------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """One S3 call; a missing object raises _Missing, anything else out of reach StorageUnavailable."""
        try:
            return fn(**kwargs)
        except ClientError as exc:
            if is_missing(exc) and "Key" in kwargs:
                raise _Missing(what) from exc
            raise self._unavailable(what, exc) from exc
        except BotoCoreError as exc:
            raise self._unavailable(what, exc) from exc

    def _unavailable(self, what: str, exc: BaseException) -> StorageUnavailable:
        return StorageUnavailable(f"storage unavailable: s3://{self.bucket}/{what}: {reason(exc)}")

    def _reach(self, prefix: str) -> None:
        """Raise StorageUnavailable unless the bucket answers a listing (its body names the reason, where a
        HEAD would only say 404)."""
        self._call(prefix, self.client.list_objects_v2, Bucket=self.bucket, Prefix=prefix, MaxKeys=1)

    def _get(self, key: str) -> bytes:
        body = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key)["Body"]
        try:
            data: bytes = body.read()
        except (BotoCoreError, OSError) as exc:
            raise self._unavailable(key, exc) from exc
        return data

    def _keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        try:
            for page in pages:
                keys.extend(obj["Key"] for obj in page.get("Contents", ()))
        except (ClientError, BotoCoreError) as exc:
            raise self._unavailable(prefix, exc) from exc
        return keys

    def _children(self, prefix: str) -> list[str]:
        """Names of the 'directories' directly under `prefix`."""
        names: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix, Delimiter="/"
        )
        try:
            for page in pages:
                names.extend(p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", ()))
        except (ClientError, BotoCoreError) as exc:
            raise self._unavailable(prefix, exc) from exc
        return names

    def _delete(self, keys: Sequence[str]) -> None:
        """Delete in batches (DeleteObjects, 1,000 keys a request); the marker, if listed, goes first alone."""
        first = [k for k in keys if k.endswith("/" + MARKER)]
        rest = [k for k in keys if k not in first]
        for batch in [first] + [rest[i : i + DELETE_BATCH] for i in range(0, len(rest), DELETE_BATCH)]:
            if not batch:
                continue
            result = self._call(
                batch[0],
                self.client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            errors = result.get("Errors") or []
            if errors:
                err = errors[0]
                raise StorageUnavailable(
                    f"storage unavailable: s3://{self.bucket}/{err.get('Key')}: {err.get('Code')}: {err.get('Message')}"
                )

    def _put_if_absent(self, key: str, body: bytes) -> bool:
        """Conditional PutObject (`If-None-Match: *`): True if written, False if the object exists (412); a
        409 conflict (a conditional write in flight) is retried."""
        for attempt in range(CONFLICT_RETRIES):
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code = error_code(exc)
                if code in PRECONDITION_FAILED:
                    return False
                if code in CONFLICT and attempt + 1 < CONFLICT_RETRIES:
                    time.sleep(0.05 * 2**attempt)
                    continue
                raise self._unavailable(key, exc) from exc
            except BotoCoreError as exc:
                raise self._unavailable(key, exc) from exc
        raise AssertionError("unreachable")

    # -- write ---------------------------------------------------------------------------------------------

    def write(
        self,
        *,
        run_id: str,
        step: int,
        epoch: int,
        shards: int,
        sources: Sequence[Source],
        world_size: int = 1,
        dataset_revision: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> StoredCheckpoint:
        for name, _ in sources:
            if name.startswith("/") or ".." in name.split("/") or name in RESERVED or name == WRITER_CLAIM:
                raise StorageError(f"checkpoint file name {name!r} is not allowed")
        uri = self.begin(run_id, step)
        try:
            entries = [self.upload(uri, name, src) for name, src in sources]
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
        except BaseException:
            self.discard(uri)
            raise
        try:
            return self.seal(uri, manifest)
        except CheckpointExists:  # what is there now is another writer's: leave it
            raise
        except BaseException:
            self.discard(uri)
            raise

    # The write in parts, for a writer whose data files come from several processes (the trainer's ranks):
    # one process claims the step (`begin`), each uploads its own files (`upload`), one seals (`seal`) once
    # every upload is in; a failure anywhere discards the step (`discard`), so nothing is sealed.

    def begin(self, run_id: str, step: int) -> str:
        """Claim `step` of the run for this writer (after removing the run's stale partial work); its URI.
        CheckpointExists when the step is sealed or another writer claimed it."""
        step_key = self._run_key(run_id) + step_name(step) + "/"
        uri = self._uri(step_key)
        self._reach(step_key)  # a missing bucket or refused key is named by the server before anything else
        if self._exists(step_key + MARKER):
            raise CheckpointExists(f"{uri} already exists")
        self.clean(run_id)
        claim = Claim(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8], time.time())
        if not self._put_if_absent(step_key + WRITER_CLAIM, msgspec.json.encode(claim)):
            raise CheckpointExists(f"{uri} already exists (another writer claimed it)")
        return uri

    def upload(self, uri: str, name: str, src: bytes | Path, known: Hashed | None = None) -> FileEntry:
        """Upload one data file of the claimed step at `uri` (multipart when large), hashing its bytes as they
        stream (one read). With `known` (the digest its writer computed while writing the file) the bytes
        sent must match it and the stored object must have their size: a file changed since it was written,
        or an object the store did not keep whole, fails the upload (StorageError)."""
        if name.startswith("/") or ".." in name.split("/") or name in RESERVED or name == WRITER_CLAIM:
            raise StorageError(f"checkpoint file name {name!r} is not allowed")
        key = self._step_key(uri) + name
        if isinstance(src, bytes):
            self._call(key, self.client.put_object, Bucket=self.bucket, Key=key, Body=src)
            entry = FileEntry(name, len(src), digest_of(src))
        else:
            with open(src, "rb") as f:
                reader = _HashingReader(f)
                try:
                    self.client.upload_fileobj(reader, self.bucket, key, Config=TRANSFER)
                except (ClientError, BotoCoreError) as exc:
                    raise self._unavailable(key, exc) from exc
                except Exception as exc:  # s3transfer wraps some failures in its own types
                    raise StorageUnavailable(f"storage unavailable: s3://{self.bucket}/{key}: {exc}") from exc
            hashed = reader.hasher.result()
            entry = FileEntry(name, hashed.size, hashed.digest)
        if known is not None:
            if (entry.size, entry.digest) != (known.size, known.digest):
                raise StorageError(f"{name} changed between its write and its upload")
            try:
                stored = self._call(key, self.client.head_object, Bucket=self.bucket, Key=key)
            except _Missing:
                stored = {}
            if stored.get("ContentLength") != known.size:
                raise StorageError(
                    f"s3://{self.bucket}/{key}: stored {stored.get('ContentLength')} bytes, sent {known.size}"
                )
        return entry

    def seal(self, uri: str, manifest: Manifest) -> StoredCheckpoint:
        """Write the manifest, then the marker (one conditional put): the step is complete. CheckpointExists
        when a marker is there already (the claim was taken from this writer)."""
        step_key = self._step_key(uri)
        raw = encode_manifest(manifest)
        self._call(
            step_key + MANIFEST, self.client.put_object, Bucket=self.bucket, Key=step_key + MANIFEST, Body=raw
        )
        digest = digest_of(raw)
        marker = msgspec.json.encode(Marker(digest, manifest.step, 0))
        if not self._put_if_absent(step_key + MARKER, marker):
            raise CheckpointExists(f"{uri} already exists (another writer sealed it)")
        return StoredCheckpoint(uri, decode_manifest(raw), to_hex(digest))

    def discard(self, uri: str) -> None:
        """Remove what a failed write of ours left under `uri` (best effort: `clean` finishes the rest)."""
        self._discard(self._step_key(uri))

    def _discard(self, step_key: str) -> None:
        """Remove what a failed write of ours left (best effort: `clean` finishes what this cannot)."""
        try:
            self._delete(self._keys(step_key))
        except StorageUnavailable as exc:
            log.warning("partial_step_not_removed", prefix=step_key, error=str(exc))

    def _exists(self, key: str) -> bool:
        try:
            self._call(key, self.client.head_object, Bucket=self.bucket, Key=key)
        except _Missing:
            return False
        return True

    # -- read ----------------------------------------------------------------------------------------------

    def complete(self, run_id: str) -> list[OnDisk]:
        run_key = self._run_key(run_id)
        self._reach(run_key)
        found: list[OnDisk] = []
        for name in self._children(run_key):
            step = parse_step(name)
            if step is None:
                continue
            marker = self._marker(run_key + name + "/")
            if isinstance(marker, Marker):
                found.append(OnDisk(step, self._uri(run_key + name), to_hex(marker.manifest_digest)))
        return sorted(found, key=lambda d: d.step, reverse=True)

    def _marker(self, step_key: str) -> Marker | str:
        try:
            return decode_marker(self._get(step_key + MARKER))
        except _Missing:
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
        return self._uri(run_key + name)

    def read_manifest(
        self, uri: str, expected_hash: str | None, *, run_id: str | None = None, step: int | None = None
    ) -> Manifest | str:
        """The checkpoint's manifest when its marker and digest check out, else why not (as on a file system)."""
        step_key = self._step_key(uri)
        self._reach(step_key)
        marker = self._marker(step_key)
        if isinstance(marker, str):
            if marker == "completion marker missing" and not self._keys(step_key):
                return "directory missing"
            return marker
        try:
            raw = self._get(step_key + MANIFEST)
        except _Missing:
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
            found = list(pool.map(lambda e: self._hash_object(step_key + e.name), manifest.files))
        for entry, hashed in zip(manifest.files, found, strict=True):
            verdict = f"file {entry.name} missing" if hashed is None else entry_verdict(entry, hashed)
            if verdict:
                return verdict
        return None

    def _hash_object(self, key: str) -> Hashed | None:
        """Size and digest of an object, hashed as it streams in; None when it is not there."""
        try:
            body = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key)["Body"]
        except _Missing:
            return None
        hasher = Hasher()
        try:
            for chunk in body.iter_chunks(CHUNK):
                hasher.update(chunk)
        except (BotoCoreError, OSError) as exc:
            raise self._unavailable(key, exc) from exc
        return hasher.result()

    def fetch(self, uri: str, files: Sequence[FileEntry], into: Path) -> str | None:
        """Download `files` of the checkpoint at `uri` into the private directory `into` in parallel ranged
        reads (`workers.s3.ranged`), each file hashed in order as its bytes arrive and written as they pass
        (never read twice); None when every file matches its manifest entry, else the first reason one does
        not. No byte is parsed here. Raises StorageUnavailable."""
        return fetch_files(self.client, self.bucket, self._step_key(uri), files, into)

    def prune(self, run_id: str, keep: int) -> list[int]:
        """Retention: delete the run's sealed steps beyond the newest `keep` (marker first, then the rest in
        batches); returns the deleted steps. Set-aside prefixes are evidence and never touched."""
        removed = []
        for old in self.complete(run_id)[keep:]:
            self._delete(self._keys(self._step_key(old.uri)))
            removed.append(old.step)
            log.info("checkpoint_pruned", step=old.step, uri=old.uri)
        return removed

    # -- move and remove -----------------------------------------------------------------------------------

    def quarantine(self, uri: str, kind: SetAsideKind, tag: str) -> str | None:
        step_key = self._step_key(uri)
        keys = self._keys(step_key)
        if not keys:
            return None
        parent, name = step_key.rstrip("/").rpartition("/")[::2]
        target = (f"{parent}/" if parent else "") + set_aside_name(name, kind, tag) + "/"
        for key in keys:
            self._call(
                key,
                self.client.copy,
                CopySource={"Bucket": self.bucket, "Key": key},
                Bucket=self.bucket,
                Key=target + key[len(step_key) :],
                Config=TRANSFER,
            )
        self._delete(keys)
        return self._uri(target)

    def delete(self, uri: str) -> None:
        try:
            self._delete(self._keys(self._step_key(uri)))
        except StorageUnavailable as exc:
            log.warning("checkpoint_not_removed", uri=uri, error=str(exc))

    def clean(self, run_id: str) -> list[str]:
        run_key = self._run_key(run_id)
        verdicts: dict[str, bool] = {}

        def stale(name: str) -> bool:
            if name not in verdicts:
                verdicts[name] = self._stale(run_key + name + "/")
            return verdicts[name]

        removed = []
        for name in self._children(run_key):
            keys = self._keys(run_key + name + "/") if parse_step(name) is not None and stale(name) else []
            if keys:  # SeaweedFS lists a prefix whose objects are all gone as an (empty) folder
                self._delete(keys)
                removed.append(self._uri(run_key + name))
        for upload in self._uploads(run_key):
            name = upload["Key"][len(run_key) :].split("/", 1)[0]
            if parse_step(name) is not None and (stale(name) or self._exists(run_key + name + "/" + MARKER)):
                self._call(
                    upload["Key"],
                    self.client.abort_multipart_upload,
                    Bucket=self.bucket,
                    Key=upload["Key"],
                    UploadId=upload["UploadId"],
                )
                removed.append(f"{self._uri(upload['Key'])} (multipart upload {upload['UploadId']})")
        if removed:
            log.info("stale_partial_work_removed", run_id=run_id, removed=removed)
        return removed

    def _stale(self, step_key: str) -> bool:
        """An unmarked step no live writer owns: no claim, or one by a gone process of this host."""
        if self._exists(step_key + MARKER):
            return False
        try:
            claim = msgspec.json.decode(self._get(step_key + WRITER_CLAIM), type=Claim)
        except (_Missing, msgspec.DecodeError, msgspec.ValidationError):
            return not self._exists(step_key + MARKER)  # sealed meanwhile: a complete step, never stale
        return claim.host == socket.gethostname() and not _process_exists(claim.pid)

    def _uploads(self, run_key: str) -> Iterator[dict[str, Any]]:
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=run_key
        )
        try:
            for page in pages:
                yield from page.get("Uploads", ()) or ()
        except (ClientError, BotoCoreError) as exc:
            raise self._unavailable(run_key, exc) from exc


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""One bucket's S3 calls, each mapped to what it means for a checkpoint: an object that is not there
(`ObjectMissing`, in a bucket that answers) is a defect of the checkpoint; anything else out of reach — an
unreachable endpoint, a timeout, 5xx, AccessDenied, bad credentials, NoSuchBucket — is `StorageUnavailable`,
naming the server's reason, and never reported as corruption."""

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from ftrain.workers.integrity import ALGORITHM, CHUNK, Hashed, Hasher
from ftrain.workers.layout import MARKER
from ftrain.workers.storage.s3.boto_client import (
    CONFLICT,
    PRECONDITION_FAILED,
    credentials_refused,
    error_code,
    is_missing,
    make_client,
    reason,
)
from ftrain.workers.storage.storage_errors import MissingCredentials, StorageUnavailable

T = TypeVar("T")
DELETE_BATCH: Final = 1000
"""Keys per DeleteObjects request (the S3 limit)."""
CONFLICT_RETRIES: Final = 5
TRANSFER: Final = TransferConfig(
    multipart_threshold=64 << 20, multipart_chunksize=16 << 20, max_concurrency=8, use_threads=True
)
"""Files over 64 MiB go up in 16 MiB parts, 8 at a time."""


class ObjectMissing(Exception):
    """The object is not there (its bucket answered)."""


class _HashingReader:
    """A file read once, front to back, hashed as boto3 takes its bytes. No seek: boto3 then buffers each part
    it sends, so a retried part is re-sent from memory, never re-read (and never hashed twice)."""

    def __init__(self, f: Any, algorithm: str) -> None:
        self._f = f
        self.hasher = Hasher(algorithm)

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._f.read(size)
        self.hasher.update(data)
        return data


class Bucket:
    """A bucket through one boto3 client (made on first use, from the standard AWS chain)."""

    def __init__(self, name: str, client: Any = None) -> None:
        self.name = name
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = make_client()
        return self._client

    def uri(self, key_prefix: str) -> str:
        """`s3://bucket/<key_prefix>` without a trailing slash."""
        return f"s3://{self.name}/{key_prefix.rstrip('/')}"

    def call(self, what: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """One S3 call; a missing object (a call naming a Key) raises ObjectMissing, anything else out of
        reach StorageUnavailable."""
        try:
            return fn(**kwargs)
        except ClientError as exc:
            if is_missing(exc) and "Key" in kwargs:
                raise ObjectMissing(what) from exc
            raise self.unavailable(what, exc) from exc
        except BotoCoreError as exc:
            raise self.unavailable(what, exc) from exc

    def unavailable(self, what: str, exc: BaseException) -> StorageUnavailable:
        kind = MissingCredentials if credentials_refused(exc) else StorageUnavailable
        return kind(f"storage unavailable: s3://{self.name}/{what}: {reason(exc)}")

    def reach(self, prefix: str) -> None:
        """Raise StorageUnavailable unless the bucket answers a listing (its body names the reason, where a
        HEAD would only say 404)."""
        self.call(prefix, self.client.list_objects_v2, Bucket=self.name, Prefix=prefix, MaxKeys=1)

    def get(self, key: str) -> bytes:
        body = self.body(key)
        try:
            data: bytes = body.read()
        except (BotoCoreError, OSError) as exc:
            raise self.unavailable(key, exc) from exc
        return data

    def body(self, key: str, **kwargs: Any) -> Any:
        """The streaming body of a GetObject (kwargs: Range, IfMatch…)."""
        return self.call(key, self.client.get_object, Bucket=self.name, Key=key, **kwargs)["Body"]

    def put(self, key: str, body: bytes) -> None:
        self.call(key, self.client.put_object, Bucket=self.name, Key=key, Body=body)

    def size(self, key: str) -> int | None:
        """The stored object's size, None when it is not there."""
        try:
            head = self.call(key, self.client.head_object, Bucket=self.name, Key=key)
        except ObjectMissing:
            return None
        return int(head["ContentLength"])

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def copy(self, key: str, to_key: str) -> None:
        """A server-side copy (multipart for large objects): no byte passes through this process."""
        self.call(
            key,
            self.client.copy,
            CopySource={"Bucket": self.name, "Key": key},
            Bucket=self.name,
            Key=to_key,
            Config=TRANSFER,
        )

    def keys(self, prefix: str) -> list[str]:
        return [obj["Key"] for obj in self._pages("list_objects_v2", "Contents", prefix)]

    def children(self, prefix: str) -> list[str]:
        """Names of the 'directories' directly under `prefix`."""
        return [
            p["Prefix"][len(prefix) :].rstrip("/")
            for p in self._pages("list_objects_v2", "CommonPrefixes", prefix, Delimiter="/")
        ]

    def uploads(self, prefix: str) -> list[dict[str, Any]]:
        """The multipart uploads in progress under `prefix`."""
        return list(self._pages("list_multipart_uploads", "Uploads", prefix))

    def start_parts(self, key: str) -> str:
        """Begin a multipart upload of `key` (with boto3's default checksum, as `upload_fileobj` sends it, where
        the AWS chain keeps checksums on); its upload id."""
        created = self.call(
            key, self.client.create_multipart_upload, Bucket=self.name, Key=key, **self._part_checksum()
        )
        return str(created["UploadId"])

    def put_part(self, key: str, upload_id: str, number: int, body: bytes | bytearray) -> dict[str, Any]:
        """Send part `number` (from 1) of the multipart upload `upload_id`; what completing it names."""
        extra = self._part_checksum()
        sent = self.call(
            key,
            self.client.upload_part,
            Bucket=self.name,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=body,
            **extra,
        )
        part: dict[str, Any] = {"ETag": sent["ETag"], "PartNumber": number}
        if extra and (crc := sent.get("ChecksumCRC32")):
            part["ChecksumCRC32"] = crc
        return part

    def finish_parts(self, key: str, upload_id: str, parts: Sequence[dict[str, Any]]) -> None:
        """Complete the multipart upload `upload_id` from its `parts`: the object appears whole, at once."""
        self.call(
            key,
            self.client.complete_multipart_upload,
            Bucket=self.name,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": sorted(parts, key=lambda p: int(p["PartNumber"]))},
        )

    def _part_checksum(self) -> dict[str, str]:
        """boto3's default part checksum (CRC32) unless the AWS chain turned request checksums off."""
        if self.client.meta.config.request_checksum_calculation == "when_supported":
            return {"ChecksumAlgorithm": "CRC32"}
        return {}

    def abort(self, upload: dict[str, Any]) -> None:
        key = upload["Key"]
        self.call(
            key,
            self.client.abort_multipart_upload,
            Bucket=self.name,
            Key=key,
            UploadId=upload["UploadId"],
        )

    def _pages(self, operation: str, field: str, prefix: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        pages = self.client.get_paginator(operation).paginate(Bucket=self.name, Prefix=prefix, **kwargs)
        try:
            for page in pages:
                yield from page.get(field) or ()
        except (ClientError, BotoCoreError) as exc:
            raise self.unavailable(prefix, exc) from exc

    def delete(self, keys: Sequence[str]) -> None:
        """Delete in batches (DeleteObjects, 1,000 keys a request); a marker, if listed, goes first alone, so
        an interrupted delete leaves an unmarked step, never a marked one with files missing."""
        first = [k for k in keys if k.endswith("/" + MARKER)]
        rest = [k for k in keys if k not in first]
        for batch in [first] + [rest[i : i + DELETE_BATCH] for i in range(0, len(rest), DELETE_BATCH)]:
            if not batch:
                continue
            result = self.call(
                batch[0],
                self.client.delete_objects,
                Bucket=self.name,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            if errors := result.get("Errors") or []:
                err = errors[0]
                raise StorageUnavailable(
                    f"storage unavailable: s3://{self.name}/{err.get('Key')}: {err.get('Code')}: "
                    f"{err.get('Message')}"
                )

    def put_if_absent(self, key: str, body: bytes) -> bool:
        """Conditional PutObject (`If-None-Match: *`): True if written, False if the object exists (412); a
        409 conflict (a conditional write in flight) is retried."""
        for attempt in range(CONFLICT_RETRIES):
            try:
                self.client.put_object(Bucket=self.name, Key=key, Body=body, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code = error_code(exc)
                if code in PRECONDITION_FAILED:
                    return False
                if code in CONFLICT and attempt + 1 < CONFLICT_RETRIES:
                    time.sleep(0.05 * 2**attempt)
                    continue
                raise self.unavailable(key, exc) from exc
            except BotoCoreError as exc:
                raise self.unavailable(key, exc) from exc
        raise AssertionError("unreachable")

    def upload(self, key: str, path: Path, algorithm: str = ALGORITHM) -> Hashed:
        """Upload a local file (multipart when large), hashing its bytes (by `algorithm`) as they stream (one
        read)."""
        with open(path, "rb") as f:
            reader = _HashingReader(f, algorithm)
            self._transfer(key, self.client.upload_fileobj, reader, self.name, key, Config=TRANSFER)
        return reader.hasher.result()

    def send(self, key: str, path: Path) -> None:
        """Upload a local file whose digest is already known: its parts read and sent in parallel."""
        self._transfer(key, self.client.upload_file, str(path), self.name, key, Config=TRANSFER)

    def _transfer(self, key: str, fn: Callable[..., object], /, *args: Any, **kwargs: Any) -> None:
        """A managed (s3transfer) upload; its failures, in whatever type it wraps them, are StorageUnavailable."""
        try:
            fn(*args, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self.unavailable(key, exc) from exc
        except Exception as exc:  # s3transfer wraps some failures in its own types
            raise StorageUnavailable(f"storage unavailable: s3://{self.name}/{key}: {exc}") from exc

    def hashed(self, key: str, algorithm: str = ALGORITHM) -> Hashed | None:
        """Size and digest (by `algorithm`) of an object, hashed as it streams in; None when it is not there."""
        try:
            body = self.body(key)
        except ObjectMissing:
            return None
        hasher = Hasher(algorithm)
        try:
            for chunk in body.iter_chunks(CHUNK):
                hasher.update(chunk)
        except (BotoCoreError, OSError) as exc:
            raise self.unavailable(key, exc) from exc
        return hasher.result()

"""Downloading checkpoint files from S3 in parallel ranged reads, hashed in order while they arrive.

One GET per file leaves a large shard to a single connection. Here a file is cut into ranges fetched by a pool
of threads, each range written at its offset (`pwrite`) as it lands; the thread that owns the file hashes the
ranges in order as the contiguous prefix completes, with at most `window` ranges held ahead of its cursor, so
memory stays bounded and no byte is read twice. Every ranged response names the object's total size: an object
longer or shorter than its manifest entry is refused at its first answer, before its bytes fill a disk.

A missing object, a size or a digest that does not match is a defect of the checkpoint (returned as the reason);
anything else (the store out of reach, a connection cut mid-body, the local disk failing) raises
StorageUnavailable, never a verdict of corruption.
"""

import os
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Final

import msgspec
from botocore.exceptions import BotoCoreError, ClientError

from ftrain.host.private_files import open_private
from ftrain.workers.integrity import Hasher
from ftrain.workers.manifest import FileEntry
from ftrain.workers.storage.s3.boto_client import error_code, is_missing, reason
from ftrain.workers.storage.storage_errors import StorageUnavailable
from ftrain.workers.storage.verdict import entry_verdict

RANGE: Final = 16 << 20
"""Bytes per ranged GET."""
THREADS: Final = 8
"""Ranged GETs in flight at once, over all the files of one call (the client's pool holds 10 connections)."""
FILES: Final = 2
"""Files downloaded at once, each hashed in its own thread (hashlib releases the GIL): with each file's
window, at most FILES × window × size bytes (256 MiB) are held."""
INVALID_RANGE: Final = frozenset({"InvalidRange", "416"})


class Ranges(msgspec.Struct, frozen=True):
    """How a download is cut and spread: range size, ranged GETs in flight, ranges held per file."""

    size: int = RANGE
    threads: int = THREADS
    window: int = THREADS
    """Ranges of one file fetched or waiting to be hashed ahead of its hash cursor: at most this many
    buffers of `size` bytes per file are held in memory."""


DEFAULT: Final = Ranges()


class Defect(Exception):
    """The object is not what the manifest says (missing, another size): the reason, in its text."""


def fetch_files(
    client: Any,
    bucket: str,
    key_prefix: str,
    files: Sequence[FileEntry],
    into: Path,
    ranges: Ranges = DEFAULT,
) -> str | None:
    """Download `files` (objects `key_prefix + entry.name`) into the directory `into`, under their names; None when every file matches its manifest entry, else the first reason one does not.
    Nothing is parsed here. Raises StorageUnavailable."""
    for entry in files:
        if "/" in entry.name or entry.name in ("", ".", ".."):
            return f"file name {entry.name!r} is not allowed"
    with ThreadPoolExecutor(ranges.threads, thread_name_prefix="ftrain-range") as pool:

        def one(entry: FileEntry) -> str | None:
            key = key_prefix + entry.name
            return fetch_file(client, bucket, key, entry, into / entry.name, pool, ranges)

        with ThreadPoolExecutor(max(1, min(FILES, len(files))), thread_name_prefix="ftrain-hash") as per_file:
            verdicts = list(per_file.map(one, files))
    return next((v for v in verdicts if v), None)


def fetch_file(
    client: Any,
    bucket: str,
    key: str,
    entry: FileEntry,
    path: Path,
    pool: ThreadPoolExecutor,
    ranges: Ranges = DEFAULT,
) -> str | None:
    """Download one object into the new private file `path` in ranges fetched by `pool`, hashing them in
    order; None when it matches `entry`, else why not. Raises StorageUnavailable."""
    spans = [(start, min(ranges.size, entry.size - start)) for start in range(0, entry.size, ranges.size)]
    todo = iter(spans or [(0, 0)])
    hasher = Hasher(entry.algorithm)
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    try:
        pending: deque[Future[bytes]] = deque()

        def submit() -> None:
            span = next(todo, None)
            if span is not None:
                pending.append(pool.submit(_fetch_range, client, bucket, key, entry, fd, *span))

        try:
            for _ in range(ranges.window):
                submit()
            while pending:
                hasher.update(pending.popleft().result())
                submit()
        except Defect as exc:
            return str(exc)
        finally:
            for future in pending:
                future.cancel()
            wait(pending)  # nothing writes to `fd` once it is closed
    except OSError as exc:
        raise StorageUnavailable(f"local cache {path}: {exc}") from exc
    finally:
        os.close(fd)
    return entry_verdict(entry, hasher.result())


def _fetch_range(
    client: Any, bucket: str, key: str, entry: FileEntry, fd: int, start: int, length: int
) -> bytes:
    """One ranged GET (`get_range`) written at its offset; its bytes, for the hash."""
    data = get_range(client, bucket, key, entry, start, length)
    view = memoryview(data)
    while view:  # a local disk error is raised as OSError and reported by the caller
        view = view[os.pwrite(fd, view, start + len(data) - len(view)) :]
    return data


def get_range(client: Any, bucket: str, key: str, entry: FileEntry, start: int, length: int) -> bytes:
    """One ranged GET of `entry`'s object (the whole object when it should be empty), checked against the
    manifest's size: Defect when the object is missing or of another size, StorageUnavailable when the
    store is out of reach or ignored the range."""
    where = f"s3://{bucket}/{key}"
    ranged = {"Range": f"bytes={start}-{start + length - 1}"} if length else {}
    try:
        response = client.get_object(Bucket=bucket, Key=key, **ranged)
        answered = int(response.get("ContentLength", 0))
        # a ranged answer names the object's size; a whole-object one (no range asked, or ignored) is it
        total = _total(response) if "ContentRange" in response else answered
        if total is not None and total != entry.size:
            response["Body"].close()
            raise Defect(_size_verdict(entry, total))
        if answered != length:  # a store that ignored the range: its bytes are not read
            response["Body"].close()
            raise StorageUnavailable(
                f"storage unavailable: {where}: {answered} bytes answered a range of {length}"
            )
        data: bytes = response["Body"].read()
    except ClientError as exc:
        if is_missing(exc):
            raise Defect(f"file {entry.name} missing") from exc
        if error_code(exc) in INVALID_RANGE:  # the object ends before this range starts
            raise Defect(_size_verdict(entry, _invalid_range_size(exc))) from exc
        raise StorageUnavailable(f"storage unavailable: {where}: {reason(exc)}") from exc
    except (BotoCoreError, OSError) as exc:
        raise StorageUnavailable(f"storage unavailable: {where}: {reason(exc)}") from exc
    return data


def _total(response: dict[str, Any]) -> int | None:
    """The object's size named by a ranged answer (`Content-Range: bytes a-b/TOTAL`); None when unnamed."""
    total = str(response.get("ContentRange", "")).rpartition("/")[2]
    return int(total) if total.isdigit() else None


def _invalid_range_size(exc: ClientError) -> int | None:
    """The object's size a 416 answer names: `Content-Range: bytes */N` (AWS, SeaweedFS) or moto's
    `ActualObjectSize`; None when it names none."""
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    found = str(headers.get("content-range", "")).rpartition("/")[2]
    found = found if found.isdigit() else str(exc.response.get("Error", {}).get("ActualObjectSize", ""))
    return int(found) if found.isdigit() else None


def _size_verdict(entry: FileEntry, found: int | None) -> str:
    if found is None:
        return f"file {entry.name} is shorter than the manifest says ({entry.size} bytes)"
    return f"file {entry.name} is {found} bytes, manifest says {entry.size}"

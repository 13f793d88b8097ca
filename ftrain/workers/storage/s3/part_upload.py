"""One object uploaded while it is being written, from memory: no local file, each byte handled once.

The writer's bytes are gathered into parts (`TRANSFER`'s part size); each full part goes up in a thread of the
upload's own while the writer goes on, at most `TRANSFER`'s concurrency in flight (a writer faster than the store waits for a part to land, so memory stays bounded). An
object smaller than one part goes up in one PutObject when it is finished; a larger one appears whole when
its multipart upload is completed, never before. On failure the multipart upload is aborted (where the store
answers): the parts never become an object, and what an abort could not reach — the process killed, the
store gone — is a stale upload `partial.clean` aborts.
"""

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import structlog

from ftrain.workers.storage.s3.bucket import TRANSFER, Bucket
from ftrain.workers.storage.storage_errors import StorageUnavailable

log = structlog.get_logger(__name__)

PART_SIZE = TRANSFER.multipart_chunksize
IN_FLIGHT = TRANSFER.max_request_concurrency


class PartUpload:
    """The object `key` of `bucket`, written front to back (`write`), then `finish`ed or `abort`ed."""

    def __init__(self, bucket: Bucket, key: str, part_size: int = PART_SIZE) -> None:
        self.bucket, self.key, self._part_size = bucket, key, part_size
        self._pool = ThreadPoolExecutor(max_workers=IN_FLIGHT, thread_name_prefix="ftrain-part")
        self.size = 0
        self._part = bytearray(part_size)
        self._filled = 0
        self._upload_id: str | None = None
        self._sent: list[Future[dict[str, Any]]] = []
        self._room = threading.BoundedSemaphore(IN_FLIGHT)

    def write(self, data: memoryview) -> None:
        """Take the next bytes; every part they fill is sent. StorageUnavailable when a part failed."""
        self.size += len(data)
        while data:
            taken = min(len(data), self._part_size - self._filled)
            self._part[self._filled : self._filled + taken] = data[:taken]
            self._filled += taken
            data = data[taken:]
            if self._filled == self._part_size:
                self._send(self._part)
                self._part, self._filled = bytearray(self._part_size), 0

    def finish(self) -> None:
        """Send what is left and make the object whole (one PutObject for a small one). StorageUnavailable
        when a part or the completion failed (the upload is then left to `abort`)."""
        rest = self._part[: self._filled]
        if self._upload_id is None:
            self._pool.shutdown()
            self.bucket.put(self.key, bytes(rest))
            return
        if rest:
            self._send(rest)
        self._pool.shutdown(wait=True)
        parts = [sent.result() for sent in self._sent]
        self.bucket.finish_parts(self.key, self._upload_id, parts)

    def abort(self) -> None:
        """Give the upload up: the parts in flight waited for, then the multipart upload aborted (best effort:
        a store out of reach keeps it until `partial.clean` aborts it)."""
        self._pool.shutdown(wait=True)
        if self._upload_id is None:
            return
        try:
            self.bucket.abort({"Key": self.key, "UploadId": self._upload_id})
        except StorageUnavailable as exc:
            log.warning("multipart_upload_not_aborted", key=self.key, error=str(exc))

    def _send(self, part: bytearray) -> None:
        failed = next((sent for sent in self._sent if sent.done() and sent.exception()), None)
        if failed is not None:
            failed.result()  # raises the part's StorageUnavailable
        if self._upload_id is None:
            self._upload_id = self.bucket.start_parts(self.key)
        self._room.acquire()
        number = len(self._sent) + 1
        sent = self._pool.submit(self.bucket.put_part, self.key, self._upload_id, number, part)
        sent.add_done_callback(lambda _: self._room.release())
        self._sent.append(sent)

"""Partial work on S3: who is writing a step (its `.writer` claim), and removing what a dead writer left.

A step without a marker is partial work. It is stale — removed, with the run's multipart uploads in it
aborted — when no live writer owns it: no claim, or a claim by a process of this host that is gone. Another
host's claim is left alone, as on a file system (a live writer elsewhere may still be uploading).
"""

import os
import socket
import time
import uuid

import msgspec
import structlog

from ftrain.host.processes import pid_alive
from ftrain.workers.layout import MARKER, WRITER_CLAIM, parse_step
from ftrain.workers.storage.s3.bucket import Bucket, ObjectMissing

log = structlog.get_logger(__name__)


class Claim(msgspec.Struct, frozen=True):
    """Who is writing a step: the body of its `.writer` object."""

    host: str
    pid: int
    nonce: str
    time: float


def claim_body() -> bytes:
    """This process's claim on a step."""
    return msgspec.json.encode(Claim(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8], time.time()))


def clean(bucket: Bucket, run_key: str) -> list[str]:
    """Remove the stale partial steps under `run_key` and abort multipart uploads into them (or into a step
    sealed meanwhile); what was removed, as URIs."""
    verdicts: dict[str, bool] = {}

    def stale(name: str) -> bool:
        if name not in verdicts:
            verdicts[name] = _stale(bucket, run_key + name + "/")
        return verdicts[name]

    removed = []
    for name in bucket.children(run_key):
        keys = bucket.keys(run_key + name + "/") if parse_step(name) is not None and stale(name) else []
        if keys:  # SeaweedFS lists a prefix whose objects are all gone as an (empty) folder
            bucket.delete(keys)
            removed.append(bucket.uri(run_key + name))
    for upload in bucket.uploads(run_key):
        name = upload["Key"][len(run_key) :].split("/", 1)[0]
        if parse_step(name) is not None and (stale(name) or bucket.exists(run_key + name + "/" + MARKER)):
            bucket.abort(upload)
            removed.append(f"{bucket.uri(upload['Key'])} (multipart upload {upload['UploadId']})")
    if removed:
        log.info("stale_partial_work_removed", prefix=run_key, removed=removed)
    return removed


def _stale(bucket: Bucket, step_key: str) -> bool:
    """An unmarked step no live writer owns: no claim, or one by a gone process of this host."""
    if bucket.exists(step_key + MARKER):
        return False
    try:
        claim = msgspec.json.decode(bucket.get(step_key + WRITER_CLAIM), type=Claim)
    except (ObjectMissing, msgspec.DecodeError, msgspec.ValidationError):
        return not bucket.exists(step_key + MARKER)  # sealed meanwhile: a complete step, never stale
    return claim.host == socket.gethostname() and not pid_alive(claim.pid)

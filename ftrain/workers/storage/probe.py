"""Proving a run's location writable at start-up: a small private file (object) written, read back and
removed, before the first step, so a location that cannot hold a checkpoint stops the job at once, not after
intervals of compute and failed saves. Each backend probes in its own way (`RunGuard.probe`); the probe's
name and bytes, and the lines for a wrong location, are the same on all.

What the answer means is kept apart as everywhere else: a location that is wrong (a path nobody can create, a
read-only or another user's directory, the run's directory a link, a bucket that refuses these credentials
a write) is a StorageError, one line, never retried; storage out of reach right now (EIO, ESTALE, a full
disk, a timeout, 5xx, a bucket that does not answer) is StorageUnavailable, and a later start may find it
back.
"""

import uuid

from ftrain.workers.layout import probe_name
from ftrain.workers.storage.storage_errors import StorageError


def unwritable(uri: str, why: str) -> StorageError:
    """The one line for a location that cannot hold the run's checkpoints."""
    return StorageError(f"checkpoint location {uri} cannot be written: {why}")


def unreadable(uri: str) -> StorageError:
    """The one line for a location that does not give back what was written to it."""
    return StorageError(f"checkpoint location {uri} does not read back what was written to it")


def probe_body() -> tuple[bytes, str]:
    """A probe's bytes and name, unique to this start (two starts never take each other's)."""
    nonce = uuid.uuid4().hex
    return nonce.encode(), probe_name(nonce)

"""One exported file: created private, filled, synced and hashed from the page cache while the disk syncs
(`workers.durable_files.synced_digest`, the save path's way: no byte is read twice from disk)."""

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import msgspec

from ftrain.host.private_files import open_private
from ftrain.workers.durable_files import synced_digest
from ftrain.workers.integrity import Digest


class Written(msgspec.Struct, frozen=True):
    """A file of the export: its name in the directory, its size and digest."""

    name: str
    size: int
    sha256: Digest


def write_new(path: Path, fill: Callable[[BinaryIO], object]) -> Written:
    """Create `path` (0600, never there before), let `fill` write it, and sync it; its size and digest."""
    with os.fdopen(open_private(path, os.O_RDWR | os.O_EXCL), "wb") as f:
        fill(f)
        f.flush()
        hashed = synced_digest(f.fileno())
    return Written(path.name, hashed.size, hashed.digest)

"""Fan-out: copy one rank's staged checkpoint files from node-local disk to durable storage.

Each file lands under its partial name (fsync'd), is checked against the size and digest taken when it was
written, and only then renamed to its name: durable storage never shows a half-copied file under a real name.
Pure per-rank file I/O, no collective, so it is safe on a background thread.
"""

import os
from collections.abc import Sequence
from pathlib import Path

from ftrain.host.atomic_file import fsync_dir
from ftrain.host.private_files import private_dir
from ftrain.workers.durable_files import copy_hashing
from ftrain.workers.integrity import Hashed
from ftrain.workers.layout import partial_path
from ftrain.workers.manifest import FileEntry


class FanOutError(OSError):
    """A copy did not arrive intact."""


def fan_out(src_dir: Path, dst_dir: Path, entries: Sequence[FileEntry]) -> None:
    """Copy `entries` from `src_dir` into `dst_dir` (verified, then renamed), then drop the staged copies."""
    private_dir(dst_dir, tighten=False)
    for entry in entries:
        src, dst = src_dir / entry.name, dst_dir / entry.name
        partial = partial_path(dst)
        partial.unlink(missing_ok=True)
        copied = copy_hashing(src, partial, entry.algorithm)
        if copied != Hashed(entry.size, entry.digest):
            partial.unlink(missing_ok=True)
            raise FanOutError(
                f"{src} changed while it was copied to {dst_dir} ({copied.size} bytes, {copied.digest})"
            )
        os.rename(partial, dst)
    fsync_dir(dst_dir)
    for entry in entries:
        (src_dir / entry.name).unlink(missing_ok=True)

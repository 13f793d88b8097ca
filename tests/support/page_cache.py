"""Files put out of the page cache, so the next read of them waits on the disk (as a resume's first does)."""

import os
from pathlib import Path


def evict(path: Path) -> None:
    """Sync the file at `path`, then drop its pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

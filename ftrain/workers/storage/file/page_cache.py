"""Whether a data file's chunks are in the page cache already: what picks how a resume checks it.

A resume checks a file with chunk digests chunk by chunk as DCP reads it so the check overlaps the reads that
wait on the disk. When the file is in the page cache, nothing waits: checking it whole and then loading it
(format 2's way) costs no more wall time and, on cores the load already keeps busy, less CPU (measured:
docs/benchmarks.md). Each chunk's first page is probed with a read that never waits for the disk
(`RWF_NOWAIT`); one that would wait, or a system without it, says not cached.
"""

import os
from pathlib import Path

from ftrain.workers.manifest import FileEntry


def cached(path: Path, entry: FileEntry) -> bool:
    """Whether the first page of each chunk of the entry's file under `path` is in the page cache (False when
    one is not, or the file cannot be probed: the chunked check then judges it)."""
    probe = bytearray(1)
    try:
        fd = os.open(path / entry.name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return all(
            os.preadv(fd, [probe], offset, os.RWF_NOWAIT) == 1
            for offset in range(0, entry.size, entry.chunk_size)
        )
    except OSError:  # EAGAIN: on the disk; EOPNOTSUPP: no such reads here
        return False
    finally:
        os.close(fd)

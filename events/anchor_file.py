"""Anchor files: append-only, 0600, one under `<home>` and optional mirrors elsewhere (`events.anchors`
says what a line holds). Each file keeps its own note chain; writers serialise on an flock of the file."""

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import msgspec

from events.anchors import Anchor, SignedAnchor, anchor_line, read_line
from events.chain import GENESIS
from events.signing import Signer

TAIL_BYTES = 64 * 1024
MAX_LINE_BYTES = 16 * 1024


@contextlib.contextmanager
def _open_locked(path: Path) -> Iterator[int]:
    """The anchor file, created 0600 (never through a symlink), exclusively locked."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _last_note(fd: int) -> SignedAnchor | None:
    """The last well-formed note in the file's tail (a torn last line is passed over)."""
    size = os.fstat(fd).st_size
    start = max(0, size - TAIL_BYTES)
    tail = os.pread(fd, size - start, start)
    for line in reversed(tail.split(b"\n")):
        note = read_line(line) if line else None
        if note is not None:
            return note
    return None


class AnchorFiles:
    """Where this user's anchors go: `paths[0]` under `<home>`, then any mirrors."""

    def __init__(self, paths: Sequence[Path], signer: Signer) -> None:
        self.paths = list(paths)
        self._signer = signer

    def append(self, anchors: Iterable[Anchor]) -> None:
        """Append `anchors` to every file, each chained after that file's last note (one write per file;
        no fsync: a note lost to a power cut weakens detection by one step, and never breaks a chain)."""
        notes = list(anchors)
        if not notes:
            return
        for path in self.paths:
            with _open_locked(path) as fd:
                last = _last_note(fd)
                prev = last.hash if last else GENESIS
                lines = []
                for note in notes:
                    line, prev = anchor_line(msgspec.structs.replace(note, prev_hash=prev), self._signer)
                    lines.append(line)
                if os.fstat(fd).st_size and os.pread(fd, 1, os.fstat(fd).st_size - 1) != b"\n":
                    lines.insert(0, b"\n")  # end a torn line, so the next note starts its own
                os.write(fd, b"".join(lines))

    def newest(self) -> Anchor | None:
        """The newest note across the files: the one that saw the highest stream sequence."""
        found: list[Anchor] = []
        for path in self.paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            try:
                note = _last_note(fd)
            finally:
                os.close(fd)
            if note is not None:
                found.append(note.anchor)
        return max(found, key=lambda a: a.stream_seq, default=None)


def read_lines(path: Path) -> list[bytes]:
    """Every line of an anchor file (none when it does not exist); a line over the cap is cut short and
    so reads as junk."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    lines = []
    with os.fdopen(fd, "rb") as f:
        while line := f.readline(MAX_LINE_BYTES):
            lines.append(line)
    return lines

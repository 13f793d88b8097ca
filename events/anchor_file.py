"""Anchor files: append-only, 0600, one under `<home>` and optional mirrors elsewhere (`events.anchors`
says what a line holds). Each file keeps its own note chain; writers serialise on an flock of the file."""

import fcntl
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from events.anchors import Anchor, SignedAnchor, anchor_line, read_line
from events.chain import GENESIS
from events.signing import Signer

TAIL_BYTES = 64 * 1024
LOCK_WAIT_S = 2.0
MAX_LINE_BYTES = 16 * 1024


def _last_note(fd: int, size: int) -> SignedAnchor | None:
    """The last well-formed note before `size` (a torn last line is passed over): the last 4 KiB first,
    the last TAIL_BYTES when that holds none."""
    for span in (4096, TAIL_BYTES):
        start = max(0, size - span)
        lines = os.pread(fd, size - start, start).split(b"\n")
        for line in reversed(lines[1:] if start else lines):  # the first may be cut by the window
            note = read_line(line) if line else None
            if note is not None:
                return note
        if not start:
            break
    return None


class AnchorBusy(OSError):
    """Another process has held the anchor file's lock past the wait: a stopped process (SIGSTOP, a frozen
    node) must never stall this one, so the note is not written and the caller says so."""


def _lock(fd: int, path: Path) -> None:
    """Exclusive flock, waited for at most LOCK_WAIT_S."""
    give_up = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= give_up:
                raise AnchorBusy(
                    f"anchor file {path} locked by another process for {LOCK_WAIT_S:g} s"
                ) from None
            time.sleep(0.005)


class _Tip:
    """One anchor file held open for appending, and its last note's hash as of the size this process last
    saw: re-read only when another process appended since."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.size = -1
        self.hash = GENESIS

    def append(self, notes: list[Anchor], signer: Signer) -> None:
        _lock(self.fd, self.path)  # writers on every node: one chain, never two links to one note
        try:
            size = os.fstat(self.fd).st_size
            torn = False
            if size != self.size:
                last = _last_note(self.fd, size)
                self.hash = last.hash if last else GENESIS
                torn = size > 0 and os.pread(self.fd, 1, size - 1) != b"\n"
            lines = [b"\n"] if torn else []  # end a torn line, so the next note starts its own
            for note in notes:
                line, self.hash = anchor_line(msgspec.structs.replace(note, prev_hash=self.hash), signer)
                lines.append(line)
            data = b"".join(lines)
            os.write(self.fd, data)
            self.size = size + len(data)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


class AnchorFiles:
    """Where this user's anchors go: `paths[0]` under `<home>`, then any mirrors."""

    def __init__(self, paths: Sequence[Path], signer: Signer) -> None:
        self.paths = list(paths)
        self._signer = signer
        self._tips: dict[Path, _Tip] = {}

    def append(self, anchors: Iterable[Anchor]) -> None:
        """Append `anchors` to every file, each chained after that file's last note (one write per file;
        no fsync: a note lost to a power cut weakens detection by one step, and never breaks a chain)."""
        notes = list(anchors)
        if not notes:
            return
        for path in self.paths:
            tip = self._tips.get(path)
            if tip is None:
                tip = self._tips[path] = _Tip(path)
            tip.append(notes, self._signer)

    def close(self) -> None:
        """Close the files held open."""
        for tip in self._tips.values():
            os.close(tip.fd)
        self._tips.clear()

    def newest(self) -> Anchor | None:
        """The newest note across the files: the one that saw the highest stream sequence."""
        found: list[Anchor] = []
        for path in self.paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            try:
                note = _last_note(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            if note is not None:
                found.append(note.anchor)
        return max(found, key=lambda a: a.stream_seq, default=None)


def read_lines(path: Path) -> list[bytes]:
    """Every line of an anchor file, without its newline (none when the file does not exist); a line over
    the cap is cut short and so reads as junk."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    lines = []
    with os.fdopen(fd, "rb") as f:
        while line := f.readline(MAX_LINE_BYTES):
            lines.append(line.removesuffix(b"\n"))
    return lines

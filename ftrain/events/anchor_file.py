"""Anchor files: append-only, 0600, one under `<home>` and optional mirrors elsewhere (`events.anchors`
says what a line holds). Each file keeps its own note chain; writers serialise on an flock of the file.

A mirror may be writable by others than its owner (another file system, another machine's mount), so what a
file holds is judged as `audit verify` judges it (`events.anchors.walk_back`): read from the end, the newest
note a trusted key signed, and the link before it; lines appended by anyone else are reported and ignored."""

import fcntl
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec
import structlog

from ftrain.events.anchors import (
    Anchor,
    Ignored,
    Kept,
    SignedAnchor,
    anchor_line,
    findings,
    read_line,
    walk_back,
)
from ftrain.events.chain import GENESIS
from ftrain.events.signing import Signer, TrustList
from ftrain.host.private_files import private_dir

FIRST_READ = 4096
TAIL_BYTES = 64 * 1024
LOCK_WAIT_S = 2.0
MAX_LINE_BYTES = 16 * 1024

log = structlog.get_logger(__name__)


def _notes_back(fd: int, size: int) -> Iterator[tuple[int, SignedAnchor]]:
    """(byte offset, note) of each well-formed line before `size`, the last first, read backwards in
    windows of 4 KiB then TAIL_BYTES; torn, junk and over-long lines are passed over."""
    end, carry, span = size, b"", FIRST_READ
    while end > 0:
        start = max(0, end - span)
        data = os.pread(fd, end - start, start) + carry
        lines = data.split(b"\n")
        offset = start + len(data)
        for line in reversed(lines[1:]):  # the first may be cut by the window: joined to the next
            offset -= len(line) + 1
            note = read_line(line) if 0 < len(line) <= MAX_LINE_BYTES else None
            if note is not None:
                yield offset + 1, note
        carry = lines[0] if len(lines[0]) <= MAX_LINE_BYTES else b"x"  # too long: junk, whatever it holds
        end, span = start, TAIL_BYTES
    note = read_line(carry) if carry else None
    if note is not None:
        yield 0, note


def _bytes_where(first: int, last: int) -> str:
    return f"the line at byte {first}" if first == last else f"the lines at bytes {first}-{last}"


def _newest_in(fd: int, size: int, trust: TrustList) -> tuple[SignedAnchor | None, list[str]]:
    """The file's newest note a trusted writer vouches for (None: none), and what was ignored to find it:
    the reading stops at the first kept note."""
    walked: list[Kept | Ignored] = []
    for step in walk_back(_notes_back(fd, size), trust):
        walked.append(step)
        if isinstance(step, Kept):
            return step.note, findings(walked, _bytes_where)
    return None, findings(walked, _bytes_where)


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
    """One anchor file held open for appending, and the hash of its newest note that counts as of the size
    this process last saw: re-read only when another process appended since."""

    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.size = -1
        self.hash = GENESIS

    def append(self, notes: list[Anchor], signer: Signer, trust: TrustList) -> None:
        _lock(self.fd, self.path)  # writers on every node: one chain, never two links to one note
        try:
            size = os.fstat(self.fd).st_size
            torn = False
            if size != self.size:  # another process appended: chain onto what counts, never a forgery
                last = _newest_in(self.fd, size, trust)[0]
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


class NewestAnchor(NamedTuple):
    """The newest note that counts across the files (None: none does), and each line ignored on the way,
    named with its file."""

    anchor: Anchor | None
    ignored: list[str]


class AnchorFiles:
    """Where this user's anchors go: `paths[0]` under `<home>`, then any mirrors; `trust`: whose notes
    count (the trust list events are judged by). A writer chains onto the newest note that counts or that
    it signed itself: its key revoked meanwhile, the file keeps one chain."""

    def __init__(self, paths: Sequence[Path], signer: Signer, trust: TrustList) -> None:
        self.paths = list(paths)
        self._signer = signer
        self.trust = trust
        self._own = TrustList(  # what this writer chains onto: its own notes too, even revoked (no fork)
            {signer.public_key: "this writer", **trust.trusted},
            {k: name for k, name in trust.revoked.items() if k != signer.public_key},
        )
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
            tip.append(notes, self._signer, self._own)

    def close(self) -> None:
        """Close the files held open."""
        for tip in self._tips.values():
            os.close(tip.fd)
        self._tips.clear()

    def newest(self) -> NewestAnchor:
        """The newest note across the files, the one that saw the highest stream sequence, among those a
        trusted writer vouches for; what was ignored is logged (`anchor_notes_ignored`) and returned."""
        found: list[Anchor] = []
        ignored: list[str] = []
        for path in self.paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            try:
                note, why = _newest_in(fd, os.fstat(fd).st_size, self.trust)
            finally:
                os.close(fd)
            if note is not None:
                found.append(note.anchor)
            ignored += [f"anchor file {path}: {line}" for line in why]
        if ignored:
            log.warning("anchor_notes_ignored", ignored=ignored)
        return NewestAnchor(max(found, key=lambda a: a.stream_seq, default=None), ignored)


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

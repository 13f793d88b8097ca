"""The hang watchdog: an attempt none of whose ranks made progress for `--hang-timeout` seconds is hung.

Ranks report through `ftrain.train.beacon` (a small file each, in the attempt's progress directory); the
supervisor polls the files and calls a rank's report progress when its record changed, timed by its own
clock. Synchronous training couples every rank at each step's collectives, so one rank that stops soon stops
them all: the attempt is hung once the newest progress of any rank is older than the timeout. A rank that
reported a save is busy, not hung, for up to SAVE_ALLOWANCE timeouts (a slow checkpoint, and the ranks
waiting for it at their next collective). The watchdog arms at the attempt's first report: start-up and
restore are not watched (torch's own timeouts cover rendezvous). Named: the ranks whose last finished step is
the lowest, and among them those whose process on this node is stopped (SIGSTOP, a frozen node), if any.
"""

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Final, NamedTuple

from ftrain.host.private_files import private_dir
from ftrain.train.beacon import Progress, read_progress

SAVE_ALLOWANCE: Final = 10
"""A save that started is given this many --hang-timeouts before its rank counts as hung."""
NAMED_MAX: Final = 8
"""Ranks named in the failure's message at most (the rest are counted)."""


class Hang(NamedTuple):
    """A hung attempt: the ranks named, with their hosts, the step they stood at, the seconds without
    progress, and the one line saying so."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    step: int
    stalled: float
    message: str


def _stopped(progress: Progress, here: str) -> bool:
    """Whether the rank's process is on this node and stopped (state T: SIGSTOP, or a debugger's trace)."""
    if progress.host != here:
        return False
    try:
        stat = Path(f"/proc/{progress.pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] in (["T"], ["t"])


def progress_root() -> Path:
    """This node's `<tmp>/ftrain-<uid>/progress`, made (0700) or checked: `ftrain run --hang-timeout` calls it
    before it writes anything. Raises UnsafeDirectory when it or a directory above it is not this user's alone
    (another user who made it could read or forge the ranks' reports)."""
    return private_dir(Path(tempfile.gettempdir()) / f"ftrain-{os.getuid()}" / "progress")


class Watchdog:
    """Watches one attempt's progress directory."""

    def __init__(self, directory: Path, timeout: float) -> None:
        self.directory = directory
        self.timeout = timeout
        self._seen: dict[int, tuple[int, int, str]] = {}
        self._changed: dict[int, float] = {}
        self._last: dict[int, Progress] = {}

    @classmethod
    def for_attempt(cls, name: str, timeout: float) -> "Watchdog":
        """A watchdog over a fresh private directory of this node's, `progress_root()/<name>` (its ranks find it
        in FTRAIN_PROGRESS_DIR); `name` holds the attempt's nonce, so another supervisor of a run with the same
        id on this node never shares it. Raises UnsafeDirectory as `progress_root` does."""
        return cls(private_dir(progress_root() / name), timeout)

    def close(self) -> None:
        """Remove the directory: the attempt ended."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def poll(self, moment: float | None = None) -> Hang | None:
        """Read every rank's report; the hang, once the attempt is hung."""
        moment = time.monotonic() if moment is None else moment
        for path in self.directory.glob("rank-*"):
            rank = path.name.removeprefix("rank-")
            if not rank.isdigit() or (progress := read_progress(path, int(rank))) is None:
                continue
            key = (progress.reports, progress.step, progress.phase)
            if self._seen.get(progress.rank) != key:
                self._seen[progress.rank], self._changed[progress.rank] = key, moment
            self._last[progress.rank] = progress
        if not self._changed:
            return None
        stalled = moment - max(self._changed.values())
        if stalled < self.timeout:
            return None
        saving = [r for r, p in self._last.items() if p.phase == "saving"]
        if any(moment - self._changed[r] < SAVE_ALLOWANCE * self.timeout for r in saving):
            return None
        return self._hang(stalled)

    def _hang(self, stalled: float) -> Hang:
        lowest = min(p.step for p in self._last.values())
        behind = sorted((p for p in self._last.values() if p.step == lowest), key=lambda p: p.rank)
        here = socket.gethostname()
        stopped = [p for p in behind if _stopped(p, here)]
        named = stopped or behind
        where = ", ".join(f"rank {p.rank} on {p.host}" for p in named[:NAMED_MAX])
        more = f" and {len(named) - NAMED_MAX} more" if len(named) > NAMED_MAX else ""
        what = "stopped (SIGSTOP or frozen)" if stopped else "made no progress"
        message = (
            f"{where}{more} {what} at step {lowest}: no rank progressed for {stalled:.0f} s "
            f"(--hang-timeout {self.timeout:g} s)"
        )
        hosts = tuple(dict.fromkeys(p.host for p in named))
        return Hang(tuple(p.rank for p in named), hosts, lowest, stalled, message)

"""What the previous attempt trained past its last checkpoint, as the trainer library saw it: goodput's
recomputed steps and their time, for every script that uses the checkpoint manager.

Every rank keeps one small file in its node-local private stage directory, rewritten in place after every
step (one `pwrite`, no fsync: a few microseconds; a kill loses at most the step being written): the attempt's
furthest step with its loop time (the saves' stalls left out, as the log's goodput counts them), and the loop
time at its newest saves. The next attempt's ranks read theirs
before they overwrite them, and the furthest one counts (a kill lands on the ranks at slightly different
points): the steps past the checkpoint resumed from and their time are what the run does again. A rank that
lands on another node (or after a reboot) finds no file: the term stays unknown, never guessed.
"""

import os
from pathlib import Path
from typing import Final

import msgspec
import structlog
import torch.distributed as dist

from ftrain.host.private_files import open_private

KEPT_SAVES: Final = 16
"""Saves remembered: enough for any checkpoint a resume can fall back to within retention."""
KEPT_SNAPSHOTS: Final = 2
"""Memory snapshots remembered: the newest staged, and the one before it (the newest recorded while the
newer one is still being written)."""
MAX_FILE_BYTES: Final = 4096
log = structlog.get_logger(__name__)


class Progress(msgspec.Struct, frozen=True):
    """An attempt's furthest step and its loop time; the step its loop began at (loop time 0) and the loop
    time at each of its newest saves."""

    location: str = ""
    """The run's checkpoint location: a record left by another run of the same name is not this one's."""
    start: int = 0
    step: int = 0
    seconds: float = 0.0
    saves: tuple[tuple[int, float], ...] = ()
    snapshots: tuple[tuple[int, float], ...] = ()
    """The loop time at its newest memory snapshots: a resume from one re-does the steps past it."""


class ProgressFile:
    """One rank's progress record of one run on this node: the previous attempt's, read when it is made, then
    this attempt's, from `begin` on."""

    def __init__(self, directory: Path, location: str, run_name: str, rank: int) -> None:
        self.path = directory / f"progress-{run_name}-rank{rank}.json"
        self.location = location
        self._fd: int | None = None
        found = None
        if raw := _read(self.path):
            try:
                found = msgspec.json.decode(raw, type=Progress)
            except msgspec.DecodeError:  # cut by a kill mid-write: unknown, not a failure
                log.info("progress_unreadable", path=str(self.path))
        self.previous = found if found is not None and found.location == location else None
        """What the attempt before this one left (None: nothing, nothing readable, or another run's)."""
        self._now = Progress()

    def begin(self, step: int) -> None:
        """This attempt's training loop begins at `step` (after its resume); the previous record is replaced."""
        self._write(Progress(location=self.location, start=step, step=step))

    def lost(self, resumed_from: int) -> tuple[int, float | None] | None:
        """The steps the previous attempt trained past `resumed_from`, and their loop time when it saved
        that step itself (None: no previous attempt here)."""
        if self.previous is None:
            return None
        steps = max(self.previous.step - resumed_from, 0)
        copies = (self.previous.start, 0.0), *self.previous.saves, *self.previous.snapshots
        saved = dict(copies).get(resumed_from)
        return steps, None if saved is None else max(self.previous.seconds - saved, 0.0)

    def finished(self, step: int, seconds: float) -> None:
        """Step `step` is done, `seconds` into this attempt's training loop."""
        self._write(msgspec.structs.replace(self._now, step=step, seconds=seconds))

    def saved(self, step: int, seconds: float) -> None:
        """Step `step` was handed to a save `seconds` into the loop."""
        saves = (*self._now.saves, (step, seconds))[-KEPT_SAVES:]
        self._write(msgspec.structs.replace(self._now, saves=saves))

    def snapshotted(self, step: int, seconds: float) -> None:
        """Step `step` was handed to a memory snapshot `seconds` into the loop."""
        snapshots = (*self._now.snapshots, (step, seconds))[-KEPT_SNAPSHOTS:]
        self._write(msgspec.structs.replace(self._now, snapshots=snapshots))

    def _write(self, progress: Progress) -> None:
        if self._fd is None:  # the first write: the file is created private, or tightened
            self._fd = open_private(self.path, os.O_RDWR)
        self._now = progress
        data = msgspec.json.encode(progress)
        try:
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
        except OSError as exc:  # a full /tmp costs the goodput term, never the run
            log.warning("progress_not_written", path=str(self.path), error=str(exc))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def furthest(
    mine: tuple[int, float | None] | None, group: dist.ProcessGroup
) -> tuple[int, float | None] | None:
    """The lost work of the job: the steps of the rank that got furthest (a kill lands on the ranks at slightly
    different points), timed by rank 0's record, as rank 0's metrics time them; None when no rank of this job
    has a record (all of them on other nodes than the attempt before)."""
    every: list[tuple[int, float | None] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    steps = max((lost[0] for lost in every if lost is not None), default=None)
    if steps is None:
        return None
    return steps, every[0][1] if every[0] is not None else None


def _read(path: Path) -> bytes:
    """The record at `path` as the attempt before left it (empty: none); a link there is never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return b""
    try:
        return os.pread(fd, MAX_FILE_BYTES, 0)
    finally:
        os.close(fd)

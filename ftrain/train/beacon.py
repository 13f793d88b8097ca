"""Each rank's progress, told to its supervisor's hang watchdog for the price of one `pwrite`.

A rank reports the step it finished after every optimizer step (`finished`) and the step it saves when a save
starts (`saving`), by overwriting a 40-byte record in a file of its own, `rank-<N>`, in the directory the
supervisor named in FTRAIN_PROGRESS_DIR: no collective, no event in the log, no network, no fsync (the
supervisor reads the page cache of its own node). Measured here: about 1 µs a report. The watchdog
(`ftrain.supervise.watchdog`) calls a report progress when the record changed, by its own clock, so no two
machines' clocks are compared.

Node-local by default (the supervisor's node; a rank on another node writes its own node's copy, which the
supervisor cannot see: a hang there still stalls the supervisor's ranks at their next collective, and is
detected, but named by them). Outside `ftrain run` (no FTRAIN_PROGRESS_DIR) a beacon does nothing. A beacon
never raises: a directory it cannot write turns it off, with one warning.
"""

import contextlib
import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal, NamedTuple

import structlog

from ftrain import settings
from ftrain.host.private_files import FILE_MODE, private_dir

RECORD: Final = struct.Struct("<QqBxxxxxxxdI4x")
"""reports (every report adds one), step, phase (0 finished, 1 saving), wall time (for people), pid."""
HOST_AT: Final = RECORD.size
"""The rank's host name follows the record, written once."""
HOST_MAX: Final = 255
FINISHED: Final = 0
SAVING: Final = 1

log = structlog.get_logger(__name__)


class Progress(NamedTuple):
    """A rank's last report as its file holds it."""

    rank: int
    reports: int
    step: int
    phase: Literal["finished", "saving"]
    time: float
    pid: int
    host: str


def rank_file(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}"


class ProgressBeacon:
    """One rank's reports; `from_env` builds it from what `ftrain run` set."""

    def __init__(self, directory: Path | None, rank: int) -> None:
        """`directory` None: a beacon that reports nothing."""
        self.rank = rank
        self._fd: int | None = None
        self._count = 0
        self._buffer = bytearray(RECORD.size)
        if directory is None:
            return
        try:
            private_dir(directory)  # refused when planted by another user: it could redirect the writes
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
            fd = os.open(rank_file(directory, rank), flags, FILE_MODE)
            os.pwrite(fd, socket.gethostname().encode()[:HOST_MAX], HOST_AT)
        except OSError as exc:  # UnsafeDirectory too
            log.warning("progress_beacon_off", directory=str(directory), error=str(exc))
            return
        self._fd = fd

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int) -> "ProgressBeacon":
        """The beacon of `rank` in the directory FTRAIN_PROGRESS_DIR names (none: one that does nothing)."""
        try:
            directory = settings.progress_dir(env)
        except settings.InvalidSetting as exc:
            log.warning("progress_beacon_off", error=str(exc))
            directory = None
        return cls(directory, rank)

    def finished(self, step: int) -> None:
        """Report that the optimizer step `step` is done: call after every one."""
        self._report(step, FINISHED)

    def saving(self, step: int) -> None:
        """Report that a save of `step` starts: a slow save is progress, not a hang."""
        self._report(step, SAVING)

    def _report(self, step: int, phase: int) -> None:
        fd = self._fd
        if fd is None:
            return
        self._count += 1
        try:
            RECORD.pack_into(self._buffer, 0, self._count, step, phase, time.time(), os.getpid())
            os.pwrite(fd, self._buffer, 0)
        except (OSError, struct.error) as exc:
            self.close()
            log.warning("progress_beacon_off", rank=self.rank, error=str(exc))

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def read_progress(path: Path, rank: int) -> Progress | None:
    """A rank's last report; None while it has made none (its file was just created: the rank is starting up
    or restoring, which is not watched) or the file holds no whole record (not a beacon's)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < RECORD.size:
        return None
    count, step, phase, when, pid = RECORD.unpack_from(data)
    if count == 0:  # the all-zero record a beacon starts with: no report yet
        return None
    host = data[HOST_AT : HOST_AT + HOST_MAX].decode("utf-8", "replace")
    return Progress(rank, count, step, "saving" if phase == SAVING else "finished", when, pid, host)

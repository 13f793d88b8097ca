"""Per-rank training metrics as JSON lines (`metrics-<rank>.jsonl`), appended across restarts.

Names follow the seed: `train/iter`, `train/loss`, `train/dt`, `train/ckpt_save_seconds`,
`train/ckpt_stage_seconds`, `train/ckpt_drain_seconds`, and on the first step after a resume
`train/restart_seconds` (from process start, imports included) and `train/lost_steps`; with the memory tier,
`train/memory_stage_seconds` (what a snapshot held the loop).
"""

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ftrain.host.private_files import open_private, private_dir

_encoder = msgspec.json.Encoder()


def metrics_path(directory: Path, rank: int) -> Path:
    """The metrics file of `rank`."""
    return directory / f"metrics-{rank}.jsonl"


def process_start_time() -> float:
    """When this process started (Unix seconds), from the kernel: the interpreter's own start-up and every
    import count toward restart time. Falls back to now where /proc is missing."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class Record(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename={
        "iter": "train/iter",
        "loss": "train/loss",
        "dt": "train/dt",
        "save_seconds": "train/ckpt_save_seconds",
        "stage_seconds": "train/ckpt_stage_seconds",
        "drain_seconds": "train/ckpt_drain_seconds",
        "restart_seconds": "train/restart_seconds",
        "lost_steps": "train/lost_steps",
        "memory_stage_seconds": "train/memory_stage_seconds",
    },
):
    """One metrics line, as the readers of the file use it: the resuming trainer and the restart analysis."""

    time: float
    iter: int | None = None
    loss: float | None = None
    dt: float | None = None
    save_seconds: float | None = None
    stage_seconds: float | None = None
    drain_seconds: float | None = None
    restart_seconds: float | None = None
    lost_steps: int | None = None
    memory_stage_seconds: float | None = None
    final: bool = False

    @property
    def is_step(self) -> bool:
        """A training step's line (not a save's, not the end-of-job drain)."""
        return self.dt is not None and self.iter is not None

    @property
    def is_save(self) -> bool:
        """The line a save writes once the training loop may go on."""
        return self.iter is not None and (self.save_seconds is not None or self.stage_seconds is not None)

    @property
    def is_snapshot(self) -> bool:
        """The line a memory snapshot writes once the training loop may go on."""
        return self.iter is not None and self.memory_stage_seconds is not None

    @property
    def stall(self) -> float:
        """Seconds this save held up training: the sync write, or async stage plus waiting for the previous;
        a memory snapshot's, its stage."""
        return (
            (self.save_seconds or 0.0)
            + (self.stage_seconds or 0.0)
            + (self.drain_seconds or 0.0)
            + (self.memory_stage_seconds or 0.0)
        )


_record = msgspec.json.Decoder(Record)


def decode_record(line: bytes) -> Record | None:
    """One metrics line; None for a line torn by a kill (or cut by a reader's seek)."""
    try:
        return _record.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def read_records(path: Path) -> list[Record]:
    """A metrics file's lines, in order, torn ones skipped ([] without the file)."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    return [record for line in lines if (record := decode_record(line)) is not None]


def segments(records: Sequence[Record]) -> list[list[Record]]:
    """One rank's records split into attempts: each resume's first step (it carries `restart_seconds`) opens
    one. An attempt that died before its first step leaves no segment."""
    out: list[list[Record]] = [[]]
    for record in records:
        if record.restart_seconds is not None and out[-1]:
            out.append([])
        out[-1].append(record)
    return out


def loop_times(attempt: Sequence[Record]) -> list[tuple[int, float]]:
    """(step, seconds in the training loop) of each step line of one attempt's records: from the previous
    step's line to its own, less the save and snapshot stalls between; the attempt's first step, its
    `train/dt`."""
    out: list[tuple[int, float]] = []
    previous: float | None = None
    held = 0.0
    for record in attempt:
        if record.is_save or record.is_snapshot:
            held += record.stall
        elif record.is_step and record.iter is not None:
            out.append(
                (record.iter, (record.dt or 0.0) if previous is None else record.time - previous - held)
            )
            previous, held = record.time, 0.0
    return out


class MetricsWriter:
    """Appends one JSON object per line, flushed each time (a SIGKILL loses at most the line being written)."""

    def __init__(self, directory: Path, rank: int) -> None:
        private_dir(directory, tighten=False)  # a resume reads these back for goodput's lost time
        self.path = metrics_path(directory, rank)
        self._file = os.fdopen(open_private(self.path, os.O_WRONLY | os.O_APPEND), "ab")

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` with a wall-clock timestamp."""
        self._file.write(_encoder.encode({"time": time.time(), **record}) + b"\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()

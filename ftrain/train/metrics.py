"""Per-rank training metrics as JSON lines (`metrics-<rank>.jsonl`), appended across restarts.

Names follow the seed: `train/iter`, `train/loss`, `train/dt`, `train/ckpt_save_seconds`,
`train/ckpt_stage_seconds`, `train/ckpt_drain_seconds`, and on the first step after a resume
`train/restart_seconds` (from process start, imports included) and `train/lost_steps`.
"""

import os
import time
from pathlib import Path
from typing import Any

import msgspec

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


def last_iter(path: Path) -> int | None:
    """The last `train/iter` a previous attempt logged (None without one): the step it reached."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            record = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue  # a line torn by a kill
        if isinstance(record, dict) and "train/iter" in record:
            return int(record["train/iter"])
    return None


def reached_step(directory: Path) -> int | None:
    """The furthest step any rank of a previous attempt logged: a kill lands on the ranks at slightly
    different points, and the work lost is what the furthest one had done."""
    reached = [step for path in directory.glob("metrics-*.jsonl") if (step := last_iter(path)) is not None]
    return max(reached, default=None)


class MetricsWriter:
    """Appends one JSON object per line, flushed each time (a SIGKILL loses at most the line being written)."""

    def __init__(self, directory: Path, rank: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = metrics_path(directory, rank)
        self._file = self.path.open("ab")

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` with a wall-clock timestamp."""
        self._file.write(_encoder.encode({"time": time.time(), **record}) + b"\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()

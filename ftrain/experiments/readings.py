"""What the restart-cost analysis reads: rank 0's metrics lines, and everything gathered for one phase."""

from collections.abc import Sequence

import msgspec

from events.schema import AnyEvent
from ftrain.experiments.config import Kill


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
    },
):
    """One line of a trainer's metrics JSONL (the fields this analysis reads)."""

    time: float
    iter: int | None = None
    loss: float | None = None
    dt: float | None = None
    save_seconds: float | None = None
    stage_seconds: float | None = None
    drain_seconds: float | None = None
    restart_seconds: float | None = None
    lost_steps: int | None = None
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
    def stall(self) -> float:
        """Seconds this save held up training: the sync write, or async stage plus waiting for the previous."""
        return (self.save_seconds or 0.0) + (self.stage_seconds or 0.0) + (self.drain_seconds or 0.0)


class PhaseInput(msgspec.Struct, frozen=True, kw_only=True):
    """Everything read for one phase. `stdout` (the supervisor's output) and `kills` (the driver's records)
    are None for a run analysed by id alone; then the checks that need them are skipped, and said to be."""

    phase: str
    run_id: str
    async_ckpt: bool
    save_interval: int | None
    events: list[AnyEvent]
    findings: list[str]
    records: list[Record]
    stdout: str | None
    kills: list[Kill] | None
    set_aside: list[int]
    """Steps of checkpoints the trainer set aside as sealed but never recorded (a kill between the two)."""


def segments(records: Sequence[Record]) -> list[list[Record]]:
    """Rank 0's records split into attempts: each resume's first step (it carries `restart_seconds`) opens
    one. An attempt that died before its first step leaves no segment."""
    out: list[list[Record]] = [[]]
    for record in records:
        if record.restart_seconds is not None and out[-1]:
            out.append([])
        out[-1].append(record)
    return out

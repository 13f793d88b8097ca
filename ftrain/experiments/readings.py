"""What the restart-cost analysis reads for one phase: its events, rank 0's metrics lines, and the rest."""

import msgspec

from ftrain.events.schema import AnyEvent
from ftrain.experiments.experiment_config import Kill
from ftrain.train.metrics import Record


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
    memory_every: int | None = None
    """Steps between memory snapshots, as the trainer's command line set them (None: no memory tier)."""

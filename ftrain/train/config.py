"""How and where a trainer checkpoints: the one object the checkpoint manager and resume share."""

from pathlib import Path

import msgspec


class CheckpointConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How and where a trainer checkpoints."""

    ckpt_dir: Path
    run_id: str | None = None
    save_interval: int | None = None
    every_seconds: float | None = None
    async_save: bool = False
    stage_dir: Path | None = None
    keep: int = 3
    resume: bool = True
    dataset_revision: str | None = None

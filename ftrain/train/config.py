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
    object_dir: str | None = None
    """The run's checkpoints on object storage (`s3://bucket/prefix/<run>`); `ckpt_dir` is then the rank's
    node-local work directory (shards written before upload, downloads before a resume), not the storage."""
    max_failed_saves: int = 3
    """Saves in a row that may fail (storage out of reach) before the job stops."""

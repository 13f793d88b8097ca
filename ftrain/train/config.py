"""How and where a trainer checkpoints: the one object the checkpoint manager, its saves and resume share.

Checked where it is made: a bad value is a ValueError naming the field, one line, before any process group,
file or connection exists.
"""

from pathlib import Path

import msgspec

from ftrain.workers.integrity import ALGORITHM, UnknownAlgorithm, check_algorithm
from ftrain.workers.layout import check_keep
from ftrain.workers.storage.location import Location


class CheckpointConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How and where a trainer checkpoints."""

    location: Location
    """The run's checkpoints: a directory or an `s3://` prefix, with the backend that holds them."""
    stage_dir: Path
    """This node's private work space: async saves stage there, and on object storage each rank writes its
    shards there before uploading them and downloads there before a resume."""
    run_id: str | None = None
    """The run in the event log (None: no log; the location alone is the truth)."""
    save_interval: int | None = None
    every_seconds: float | None = None
    async_save: bool = False
    keep: int = 3
    resume: bool = True
    dataset_revision: str | None = None
    max_failed_saves: int = 3
    """Saves in a row that may fail (storage out of reach, a full disk) before the job stops."""
    world_change: str = "refuse"
    """A resume on another world size whose data position is per rank or absent: "refuse" or "warn"."""
    digest: str = ALGORITHM
    """The algorithm the saves hash data files with (`workers.integrity.ALGORITHMS`); a resume checks each
    file with the one its manifest entry names, whatever this is."""
    memory_every: int | None = None
    """Steps between memory snapshots (the memory tier, under the durable checkpoints); None: no memory tier."""
    memory_root: Path | None = None
    """This node's snapshots of the job (`workers.memory_tier.memory_root`); set with `memory_every`."""
    memory_cap: int | None = None
    """The bytes one rank's snapshots may hold at once (None: bounded by the tmpfs's free space alone)."""

    def __post_init__(self) -> None:
        check_keep(self.keep)
        if self.save_interval is not None and self.save_interval < 1:
            raise ValueError(f"save_interval={self.save_interval}: a positive number of steps, or None")
        if self.every_seconds is not None and not 0 < self.every_seconds < float("inf"):
            raise ValueError(f"every_seconds={self.every_seconds}: a positive number of seconds, or None")
        if self.world_change not in ("refuse", "warn"):
            raise ValueError(f"world_change={self.world_change!r}: 'refuse' or 'warn'")
        if self.memory_every is not None and (self.memory_every < 1 or self.memory_root is None):
            raise ValueError(
                f"memory_every={self.memory_every}: a positive number of steps with a memory_root"
            )
        if self.max_failed_saves < 1:
            raise ValueError(f"max_failed_saves={self.max_failed_saves}: at least 1")
        try:
            check_algorithm(self.digest)
        except UnknownAlgorithm as exc:
            raise ValueError(f"digest: {exc}") from None

    @property
    def run_name(self) -> str:
        """The name manifests carry: the run id, or without a log the location's last segment."""
        return self.run_id or self.location.run

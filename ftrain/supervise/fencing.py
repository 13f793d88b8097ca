"""The supervisor claims the run's storage fence for each attempt the log opens, before any of its processes.

The log refuses a superseded attempt's events, not its writes: until the new attempt's trainer claimed the
run at start-up (seconds to minutes after the log opened the attempt), an old attempt still running (an
orphan, or the attempt of a supervisor that was stopped and lost its lease) could seal steps and prune the
ones the log vouches for. Claimed here, the old attempt is fenced from the moment the new one exists. The
trainer's rank 0 claims again (plain torchrun has no supervisor); a claim never lowers, so the two agree.
"""

from pathlib import Path

from ftrain.workers.storage.location import run_location
from ftrain.workers.storage.open import open_run


def claim_opened(ckpt_dir: Path | str, attempt: int, *, vouched: bool) -> None:
    """Claim the run at `ckpt_dir` (a path, or its `s3://` location) for `attempt`, just opened in the log.
    `vouched`: the log holds a checkpoint of the run, so its location must be found, never made afresh (as the
    trainer does: a storage that is not mounted is out of reach, not empty); a run that never checkpointed
    (its first attempt, or one that failed before its first save) may have no directory yet. Raises Fenced,
    StorageUnavailable, StorageError or OSError."""
    store = open_run(run_location(ckpt_dir))
    if vouched:
        store.reachable()
    store.claim(attempt)

"""Retention: keep the newest K checkpoints the log vouches for, delete older ones.

`workers.layout.retire` decides, for every backend: a run with a log counts only the steps the log
accepted (vouched for at start-up, or recorded by this job since); a step sealed on disk that the log never
accepted (an older attempt's, sealed after the log moved on) is neither counted nor deleted: the next resume
sets it aside as `unrecorded`, and it can never push an accepted checkpoint out. Without a log the listing is
the only truth.
The saver decides right after a checkpoint was sealed, names the retired steps in that checkpoint's
`checkpointed` event, and deletes them only after recording it, so a deletion always follows a newer valid
checkpoint and the log says which checkpoints are gone; with K ≥ 2 the checkpoint a job resumed from stays
until K newer ones exist. Set-aside directories (corrupt, unrecorded, superseded) are evidence and are never
touched, nor is a `step-N` that is a link (its target is not the run's to delete).
"""

from collections.abc import Collection
from pathlib import Path

import structlog

from ftrain.host.nofollow import remove_dir
from ftrain.workers.layout import MARKER, complete_steps, step_dir

log = structlog.get_logger(__name__)


def prune(run_dir: Path, steps: Collection[int]) -> list[int]:
    """Delete the complete checkpoints of `steps` (marker first) from a run directory; returns the steps it
    found complete and set out to delete. What cannot be removed is logged and left for the next prune."""
    removed = [step for step in complete_steps(run_dir) if step in steps]
    for step in removed:
        try:  # the marker first: a half-deleted directory must not look complete
            remove_dir(run_dir, step_dir(run_dir, step).name, first=MARKER)
        except OSError as exc:  # the next prune tries again; training goes on
            log.warning("prune_failed", step=step, run_dir=str(run_dir), error=str(exc))
            continue
        log.info("checkpoint_pruned", step=step, run_dir=str(run_dir))
    return removed

"""Retention: keep the newest K complete checkpoints of a run, delete older ones.

Called only right after a checkpoint was sealed, so a deletion always follows a newer valid checkpoint; with
K ≥ 2 the checkpoint a job resumed from stays until K newer ones exist. Set-aside directories (corrupt,
unrecorded, superseded) are evidence and are never touched, nor is a `step-N` that is a link (its target is
not the run's to delete).
"""

from pathlib import Path

import structlog

from ftrain.workers.layout import MARKER, check_keep, complete_steps, step_dir
from ftrain.workers.nofollow import remove_dir

log = structlog.get_logger(__name__)


def prune(run_dir: Path, keep: int) -> list[int]:
    """Delete complete checkpoints beyond the newest `keep`; returns the deleted steps."""
    removed = complete_steps(run_dir)[check_keep(keep) :]
    for step in removed:
        try:  # the marker first: a half-deleted directory must not look complete
            remove_dir(run_dir, step_dir(run_dir, step).name, first=MARKER)
        except OSError as exc:  # the next prune tries again; training goes on
            log.warning("prune_failed", step=step, run_dir=str(run_dir), error=str(exc))
            continue
        log.info("checkpoint_pruned", step=step, run_dir=str(run_dir))
    return removed

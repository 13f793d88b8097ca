"""The progress record behind goodput's recomputed term (`ftrain.train.lost_work`): what a resumed attempt
learns of the steps, and their loop time, that the attempt before it threw away. Files only, no torch."""

import os
import stat
from pathlib import Path

from ftrain.train.lost_work import KEPT_SAVES, ProgressFile

RUN = "file:///ckpt/run-1"


def _attempt(directory: Path, start: int, steps: range, saves: dict[int, float]) -> None:
    """An attempt that began at `start` and finished `steps`, one loop second each, saving at `saves`."""
    record = ProgressFile(directory, RUN, "run-1", 0)
    record.begin(start)
    for step in steps:
        seconds = float(step - start)
        if step in saves:
            record.saved(step, seconds + saves[step])
        record.finished(step, seconds)
    record.close()


def test_the_steps_past_the_checkpoint_and_their_time_are_what_the_next_attempt_learns(
    tmp_path: Path,
) -> None:
    _attempt(tmp_path, 0, range(1, 26), {10: 0.0, 20: 0.0})
    again = ProgressFile(tmp_path, RUN, "run-1", 0)
    assert again.lost(20) == (5, 5.0)
    assert again.lost(10) == (15, 15.0)
    assert again.lost(0) == (25, 25.0)  # the attempt's own start: loop time 0
    assert again.lost(5) == (20, None)  # a step it neither began at nor saved: not timed, never guessed
    assert stat.S_IMODE(os.stat(again.path).st_mode) == 0o600


def test_a_record_cut_by_a_kill_or_left_by_another_run_of_that_name_is_unknown(tmp_path: Path) -> None:
    assert ProgressFile(tmp_path, RUN, "run-1", 0).lost(10) is None  # no attempt before
    _attempt(tmp_path, 0, range(1, 12), {10: 0.0})
    assert ProgressFile(tmp_path, "s3://bucket/other/run-1", "run-1", 0).lost(10) is None
    path = tmp_path / "progress-run-1-rank0.json"
    path.write_bytes(path.read_bytes()[:17])
    assert ProgressFile(tmp_path, RUN, "run-1", 0).lost(10) is None


def test_each_rank_keeps_its_own_record_and_only_the_newest_saves(tmp_path: Path) -> None:
    _attempt(
        tmp_path, 100, range(101, 101 + 2 * KEPT_SAVES), {s: 0.0 for s in range(101, 101 + 2 * KEPT_SAVES)}
    )
    assert not (tmp_path / "progress-run-1-rank1.json").exists()
    again = ProgressFile(tmp_path, RUN, "run-1", 0)
    last = 100 + 2 * KEPT_SAVES
    assert again.lost(last - 1) == (1, 1.0)
    assert again.lost(101) == (last - 101, None)  # forgotten: older than the newest KEPT_SAVES saves


def test_a_resume_from_a_memory_snapshot_learns_the_time_of_the_steps_past_it(tmp_path: Path) -> None:
    record = ProgressFile(tmp_path, RUN, "run-1", 0)
    record.begin(0)
    for step in range(1, 27):
        if step in (20,):
            record.saved(step, float(step))
        elif step % 2 == 0:
            record.snapshotted(step, float(step))
        record.finished(step, float(step))
    record.close()
    again = ProgressFile(tmp_path, RUN, "run-1", 0)
    assert again.lost(26) == (0, 0.0) and again.lost(24) == (2, 2.0), "the newest two snapshots"
    assert again.lost(22) == (4, None), "an older snapshot's time is forgotten: estimated, never guessed"
    assert again.lost(20) == (6, 6.0)

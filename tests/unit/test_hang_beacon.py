"""A rank's progress report for the hang watchdog costs microseconds and its file holds the last; outside
`ftrain run`, or where it cannot write, it does nothing and never fails (the watchdog over real processes:
tests/integration/test_hang.py)."""

import os
import time
from pathlib import Path

from ftrain.supervise.watchdog import Watchdog
from ftrain.train.beacon import ProgressBeacon, rank_file, read_progress


def test_a_report_costs_microseconds_and_the_file_holds_the_last(tmp_path: Path) -> None:
    beacon = ProgressBeacon.from_env({"FTRAIN_PROGRESS_DIR": str(tmp_path / "p")}, 3)
    reports = 20_000
    started = time.perf_counter()
    for step in range(1, reports + 1):
        beacon.finished(step)
    each = (time.perf_counter() - started) / reports
    beacon.saving(reports)
    last = read_progress(rank_file(tmp_path / "p", 3), 3)
    assert last is not None and (last.step, last.phase, last.reports, last.pid) == (
        reports, "saving", reports + 1, os.getpid()
    )  # fmt: skip
    assert each < 50e-6, each
    print(f"a progress report costs {each * 1e6:.1f} µs")
    off = ProgressBeacon.from_env({}, 0)  # outside `ftrain run`: nothing, and never an error
    off.finished(1)
    unwritable = tmp_path / "ro"
    unwritable.mkdir(mode=0o500)
    ProgressBeacon.from_env({"FTRAIN_PROGRESS_DIR": str(unwritable / "p")}, 0).finished(1)


def test_the_watchdog_arms_at_the_first_real_report_not_at_start_up_or_restore(tmp_path: Path) -> None:
    """A rank's beacon exists from the trainer's start (its file holds an all-zero record) but the rank reports
    only once a step is done: a start-up or restore far longer than --hang-timeout is not a hang; a rank that
    then stops reporting is."""
    directory = tmp_path / "p"
    ranks = [ProgressBeacon(directory, rank) for rank in (0, 1)]  # started: setting up, restoring
    assert read_progress(rank_file(directory, 0), 0) is None
    watchdog = Watchdog(directory, timeout=5)
    for moment in (0.0, 6.0, 600.0, 36_000.0):  # ten hours of restore: never "hung at step 0"
        assert watchdog.poll(moment) is None
    ranks[0].finished(41)  # the first step after the restore arms it
    ranks[1].finished(41)
    assert watchdog.poll(36_001.0) is None
    assert watchdog.poll(36_005.5) is None
    hang = watchdog.poll(36_006.5)
    assert hang is not None and hang.step == 41 and hang.ranks == (0, 1)

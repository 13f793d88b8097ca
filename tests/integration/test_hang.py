"""The hang watchdog over real processes: reading the beacons of real (stopped) ranks, it names the stopped
rank and gives a saving rank its allowance (a report's cost: tests/unit/test_hang_beacon.py; a real
`ftrain run` whose node is stopped: tests/e2e/test_hang.py)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from ftrain.supervise.watchdog import SAVE_ALLOWANCE, Watchdog
from ftrain.train.beacon import ProgressBeacon
from tests.support.training import stopped, wait_for


def test_the_watchdog_names_the_stopped_rank_and_gives_a_saving_rank_its_allowance(tmp_path: Path) -> None:
    directory = tmp_path / "progress"
    code = (
        "import os, signal, sys\nfrom ftrain.train.beacon import ProgressBeacon\n"
        "b = ProgressBeacon.from_env(os.environ, int(sys.argv[1]))\nb.finished(int(sys.argv[2]))\n"
        "os.kill(os.getpid(), signal.SIGSTOP)\n"
    )
    env = {**os.environ, "FTRAIN_PROGRESS_DIR": str(directory)}
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(r), "7"], env=env) for r in (0, 1)]
    try:
        wait_for(lambda: all(stopped(p.pid) for p in ranks), None, "both ranks stopped", 30)
        os.kill(
            ranks[0].pid, signal.SIGCONT
        )  # rank 0 blocks in "a collective" (it exits): rank 1 stays stopped
        ranks[0].wait(10)
        watchdog = Watchdog(directory, timeout=5)
        assert watchdog.poll(100.0) is None  # armed: the first look is progress
        assert watchdog.poll(104.0) is None
        hang = watchdog.poll(105.5)
        assert hang is not None and hang.ranks == (1,) and hang.step == 7
        assert "rank 1 on " in hang.message and "stopped (SIGSTOP or frozen) at step 7" in hang.message
        saver = ProgressBeacon(directory, 0)  # a rank starts a save: not hung until its allowance is spent
        saver.saving(8)
        assert watchdog.poll(110.0) is None
        assert watchdog.poll(110.0 + SAVE_ALLOWANCE * 5 - 1) is None
        late = watchdog.poll(110.0 + SAVE_ALLOWANCE * 5 + 1)
        assert late is not None and late.ranks == (1,)  # still the lowest step
    finally:
        for p in ranks:
            p.kill()
            p.wait()

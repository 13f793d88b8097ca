"""The pieces of the save path that only a fresh interpreter shows: when a process started (read from the
kernel) and the fault injection that acts at import (a typo in `FTRAIN_KILL_AT` or `FTRAIN_STEP_DELAY`), the
kill at a named point, the delay of every step and every exchange of replicas, the ranks' agreement on a flag
(the pieces in this process: tests/unit/test_checkpoint_parts.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftrain.settings import KILL_POINTS
from ftrain.train.metrics import process_start_time


def test_process_start_time_is_when_the_process_started(tmp_path: Path) -> None:
    """Read from the kernel, so a child's start lies between our spawning it and its own first statement
    (a clock read at the call would come after it); the kernel reports the boot time in whole seconds,
    hence up to a second early."""
    before = time.time()
    code = (
        "import time; first_statement = time.time()\n"
        "from ftrain.train.metrics import process_start_time; print(process_start_time(), first_statement)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    started, first_statement = map(float, out.split())
    assert before - 1.5 <= started < first_statement
    assert process_start_time() < before  # this process, too, started before this test


def import_faults(kill_at: str) -> subprocess.CompletedProcess[str]:
    """Import ftrain.train.faults in a fresh interpreter with FTRAIN_KILL_AT set."""
    return subprocess.run(
        [sys.executable, "-c", "import ftrain.train.faults"],
        env={**os.environ, "FTRAIN_KILL_AT": kill_at},
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("kill_at", ["boom:3", "step:x", "step:", "write", "fanout:-1", "step:3,boom:4"])
def test_an_invalid_kill_point_fails_at_import_naming_the_accepted_points(kill_at: str) -> None:
    """A typo must not silently disable the fault an experiment relies on."""
    result = import_faults(kill_at)
    assert result.returncode == 1
    assert f"InvalidSetting: FTRAIN_KILL_AT={kill_at!r}" in result.stderr
    assert ", ".join(KILL_POINTS) in result.stderr


def test_valid_kill_points_import_cleanly_and_kill_at_the_named_point_only() -> None:
    code = (
        "from ftrain.train.faults import fault_point\n"
        "fault_point('step', 2); fault_point('finalize', 3); fault_point('write', 20)\n"
        "print('alive before step 3', flush=True)\n"
        "fault_point('step', 3)\n"
        "print('alive after step 3', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("FTRAIN_KILL_ONCE", "TORCHELASTIC_RUN_ID")}
    result = subprocess.run(  # a session of its own: the kill takes the child's process group
        [sys.executable, "-c", code],
        env={**env, "FTRAIN_KILL_AT": "finalize:20,step:3"},
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    assert (result.returncode, result.stdout, result.stderr) == (-signal.SIGKILL, "alive before step 3\n", "")


def test_the_injected_delays_slow_every_step_and_every_replica_exchange_and_nothing_else() -> None:
    code = (
        "import time\n"
        "from ftrain.train.faults import fault_point\n"
        "def timed(*points):\n"
        "    began = time.monotonic()\n"
        "    for point in points: fault_point(point, 1)\n"
        "    return time.monotonic() - began\n"
        "print(timed('write', 'sealed', 'snapshot'), timed('step', 'step'), timed('replicate'))\n"
    )
    delays = {"FTRAIN_STEP_DELAY": "0.4", "FTRAIN_REPLICA_DELAY": "0.3"}
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **delays},
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    saves, steps, replicate = map(float, out.split())
    assert saves < 0.2 and 0.8 <= steps < 1.5 and 0.3 <= replicate < 0.7
    typo = subprocess.run([sys.executable, "-c", "import ftrain.train.faults"],
                          env={**os.environ, "FTRAIN_STEP_DELAY": "forever"}, capture_output=True, text=True)  # fmt: skip
    assert typo.returncode == 1 and "InvalidSetting: FTRAIN_STEP_DELAY='forever'" in typo.stderr


def test_the_ranks_agree_a_flag_any_of_them_raised(tmp_path: Path) -> None:
    """Two processes on a real gloo group: rank 1 alone busy, both told so; nobody busy, both told not."""
    code = (
        "import sys, torch.distributed as dist\n"
        "from ftrain.train.agreement import any_rank\n"
        "rank = int(sys.argv[1])\n"
        "dist.init_process_group('gloo', init_method=sys.argv[2], rank=rank, world_size=2)\n"
        "group = dist.new_group(backend='gloo')\n"
        "print(any_rank(rank == 1, group), any_rank(False, group))\n"
    )
    store = f"file://{tmp_path / 'store'}"
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(r), store], stdout=subprocess.PIPE, text=True)
             for r in range(2)]  # fmt: skip
    assert [rank.communicate(timeout=60)[0].split() for rank in ranks] == [["True", "False"]] * 2

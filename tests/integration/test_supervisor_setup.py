"""What can refuse an attempt's set-up is checked before the log is touched, and what refuses later is
recorded as the attempt's failure: another uid's `<tmp>/ftrain-<uid>` (the hang watchdog's progress
directory's parent) is refused by `ftrain run --hang-timeout` with one line and nothing written, and, met by an
attempt the log already opened, recorded `failed` (reason `setup`), never left `running`."""

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftrain.domain.lifecycle import FailIntent
from ftrain.supervise.supervisor import Relaunches, Supervisor
from tests.support.builders import Intents
from tests.support.cli import Cli
from tests.support.stand_in_trainer import ONE_GPU, starts
from tests.support.stand_in_trainer import cli as cli  # the fixtures
from tests.support.stand_in_trainer import trainer as trainer

NOBODY = 65534

AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another user",
)


@pytest.fixture
def squatted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A shared, sticky temporary directory (as /tmp is) in which another uid made this user's `ftrain-<uid>`
    first."""
    shared = Path(tempfile.mkdtemp(prefix="ftrain-squat-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        squat = shared / f"ftrain-{os.getuid()}"
        subprocess.run([*AS_NOBODY, "mkdir", "-m", "777", str(squat)], check=True)
        monkeypatch.setattr(tempfile, "tempdir", str(shared))
        yield squat
    finally:
        shutil.rmtree(shared)


@needs_root
def test_a_squatted_progress_directory_is_refused_before_the_log_is_touched(
    cli: Cli, trainer: tuple[Path, Path], squatted: Path
) -> None:
    script, state = trainer
    before = cli.last_seq()
    code, out, err = cli("run", "P", *ONE_GPU, "--hang-timeout", "5", "--", str(script), str(state), "exit0")
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert err.startswith(
        f"ftrain run: error: {squatted} (above {squatted}/progress) is owned by uid {NOBODY}"
    )
    assert cli.last_seq() == before and starts(state) == []
    assert list(squatted.iterdir()) == []


@needs_root
def test_an_opened_attempt_that_cannot_be_set_up_is_recorded_failed(tmp_path: Path, squatted: Path) -> None:
    started = tmp_path / "started"
    (tmp_path / "ckpt").mkdir()  # the run's location (a relaunch claims only one that exists)
    recorder = Intents()
    outcome = Supervisor(
        "r",
        lambda hosts: [sys.executable, "-c", f"open({str(started)!r}, 'w')"],
        os.environ,
        tmp_path / "ckpt",
        Relaunches(backoff=0),
        recorder,
        attempt=4,
        opener=lambda hosts: pytest.fail("an attempt that could not be set up is not relaunched"),
        hosts=("localhost",),
        hang_timeout=5,
    ).run()
    assert (outcome.status, outcome.exit_code, outcome.recorded) == ("gave-up", 1, True)
    said = f"UnsafeDirectory: {squatted} (above {squatted}/progress) is owned by uid {NOBODY}"
    assert outcome.message.startswith(f"run r gave up: attempt 4: {said}"), outcome.message
    [failed] = recorder.intents
    assert isinstance(failed, FailIntent) and (failed.reason, failed.attempt) == ("setup", 4)
    assert failed.message.startswith(said)
    assert not started.exists()

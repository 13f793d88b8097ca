"""The supervisor claims the run's storage fence for the attempt the log opened before any of its processes
starts, on a file system and on S3 (moto): the attempt's first process already finds the run claimed for it,
and an older attempt's writer is fenced; a relaunch whose storage is out of reach then is recorded `failed`
(reason `setup`) with nothing started, never left `running` (the scenario through torchrun, a stopped
supervisor's attempt fenced by the takeover: tests/e2e/test_supervisor_fence.py)."""

import os
import sys
import tempfile
from pathlib import Path

import pytest

from ftrain.domain.lifecycle import CompleteIntent, FailIntent
from ftrain.supervise.supervisor import Relaunches, Supervisor
from ftrain.workers.storage.location import run_location
from ftrain.workers.storage.open import open_run
from ftrain.workers.storage.port import RunStorage
from ftrain.workers.storage.storage_errors import Fenced
from tests.support.builders import Intents
from tests.support.cli import Cli
from tests.support.s3 import Endpoint
from tests.support.stand_in_trainer import ONE_GPU, starts
from tests.support.stand_in_trainer import cli as cli  # the fixtures
from tests.support.stand_in_trainer import trainer as trainer

READ_OWNER = (
    "import sys, tempfile\nfrom pathlib import Path\n"
    "from ftrain.workers.storage.location import run_location\nfrom ftrain.workers.storage.open import open_run\n"
    "owner = open_run(run_location(sys.argv[1]), Path(tempfile.gettempdir())).owner()\n"
    "Path(sys.argv[2]).write_text(str(owner))\n"
)


def _supervise(
    ckpt: Path | str, attempt: int, command: list[str], recorder: Intents, *, vouched: bool = False
) -> Supervisor:
    return Supervisor(
        "r",
        lambda hosts: command,
        os.environ,
        ckpt,
        Relaunches(backoff=0, max_retries=0),
        recorder,
        attempt=attempt,
        opener=lambda hosts: pytest.fail("nothing to relaunch"),
        hosts=("localhost",),
        vouched=vouched,
    )


def _store(ckpt: Path | str) -> RunStorage:
    return open_run(run_location(ckpt), Path(tempfile.gettempdir()))


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_the_attempt_is_claimed_before_its_first_process_starts(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt: Path | str = tmp_path / "ckpt" / "r"
    if backend == "s3":
        moto: Endpoint = request.getfixturevalue("moto")
        for name, value in moto.env().items():
            monkeypatch.setenv(name, value)
        ckpt = f"s3://{moto.new_bucket()}/ckpt/r"
    else:
        Path(ckpt).mkdir(parents=True)
    _store(ckpt).claim(2)  # the last attempt's trainer claimed the run
    seen = tmp_path / "owner"
    recorder = Intents()
    outcome = _supervise(ckpt, 3, [sys.executable, "-c", READ_OWNER, str(ckpt), str(seen)], recorder).run()
    assert outcome.status == "completed" and recorder.intents == [CompleteIntent(attempt=3)]
    assert seen.read_text() == "3"  # claimed before the attempt's first process ran
    with pytest.raises(Fenced, match="attempt 2 is superseded by attempt 3"):
        _store(ckpt).check(2)  # attempt 2's processes, still running somewhere, can neither seal nor prune
    _store(ckpt).claim(3)  # the trainer's own claim of the same attempt still succeeds


def test_a_relaunch_whose_storage_is_out_of_reach_is_recorded_failed_and_not_started(tmp_path: Path) -> None:
    """The log holds a checkpoint of the run (vouched) and its location is gone: out of reach, never made."""
    started = tmp_path / "started"
    recorder = Intents()
    gone = tmp_path / "unmounted" / "r"  # the storage root is not there: claiming must not recreate it
    command = [sys.executable, "-c", f"open({str(started)!r}, 'w')"]
    outcome = _supervise(gone, 2, command, recorder, vouched=True).run()
    assert (outcome.status, outcome.exit_code, outcome.recorded) == ("gave-up", 1, True)
    [failed] = recorder.intents
    assert isinstance(failed, FailIntent) and (failed.reason, failed.attempt) == ("setup", 2)
    assert failed.message.startswith("StorageUnavailable: "), failed.message
    assert not started.exists() and not gone.parent.exists()


def test_a_relaunch_of_a_run_that_never_checkpointed_makes_its_location(tmp_path: Path) -> None:
    """A run whose first attempt failed before its first save (or was launched by `ftrain launch`, which
    claims nothing) has no directory yet: its relaunch claims it (and makes it), as a first attempt does."""
    started = tmp_path / "started"
    recorder = Intents()
    fresh = tmp_path / "ckpt" / "r"
    command = [sys.executable, "-c", f"open({str(started)!r}, 'w')"]
    outcome = _supervise(fresh, 2, command, recorder).run()
    assert outcome.status == "completed" and recorder.intents == [CompleteIntent(attempt=2)]
    assert started.exists() and _store(fresh).owner() == 2


def test_a_relaunch_claims_the_fence_before_the_log_opens_its_attempt(
    cli: Cli, trainer: tuple[Path, Path]
) -> None:
    """`ftrain run --run-id` of a failed run claims the fence for the attempt it is about to open before it
    appends the `resumed` (an older attempt still saving is fenced from the moment the log moves on), and a
    run the log holds a checkpoint of whose location is gone (an unmounted file system) is refused with one
    line: nothing opened, nothing started, the location never made afresh."""
    script, state = trainer
    cli.ok("launch", "P", *ONE_GPU, "--run-id", "r")
    cli.ok("checkpoint", "r", "--step", "10", "--epoch", "0", "--shards", "1", "--state", "{}")
    cli.ok("fail", "r")
    run = cli.storage() / "r"
    moved = cli.storage().with_name("elsewhere")
    cli.storage().rename(moved)  # unmounted
    before = cli.last_seq()
    command = ("--", str(script), str(state), "exit0")
    code, out, err = cli("run", "P", *ONE_GPU, "--run-id", "r", *command)
    assert (code, out) == (1, "") and err.startswith(
        "ftrain run: run r not relaunched: its checkpoints cannot be"
    )
    assert err.count("\n") == 1 and "storage unavailable" in err, err
    assert cli.last_seq() == before and starts(state) == [] and not cli.storage().exists()
    moved.rename(cli.storage())  # mounted again
    assert _store(run).owner() == 0
    code, out, err = cli("run", "P", *ONE_GPU, "--run-id", "r", *command)
    assert code == 0, err
    assert [s["FTRAIN_ATTEMPT"] for s in starts(state)] == ["2"] and _store(run).owner() == 2

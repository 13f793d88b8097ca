"""What `ftrain run` decides, said in plain words (issue 34): pure decisions, no process started."""

from pathlib import Path

import pytest

from ftrain.cli.main import main
from ftrain.cli.render import summary
from ftrain.events.schema import Resumed
from ftrain.supervise.supervisor import attempt_head


def test_run_without_a_training_command_is_a_usage_error_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FTRAIN_HOME", str(tmp_path / "home"))
    with pytest.raises(SystemExit) as ended:
        main(["run", "P", "--nodes", "1", "--nproc-per-node", "2"])
    assert ended.value.code == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "ftrain run: error: no training command: put it after `--` (`-- train.py --lr "
                              "3e-4`, `-- -m mypkg.train`; the reference trainer: `-- -m ftrain.examples.train`)\n")  # fmt: skip
    assert not (tmp_path / "home").exists()


def test_an_attempt_keeps_its_job_starts_budget_across_a_requeue() -> None:
    assert [attempt_head(n, 1, n, 4) for n in (1, 2)] == ["Attempt 1 of 4", "Attempt 2 of 4"]
    # the requeued job start opens the run's attempt 2: its own budget is 4 tries again, not "of 5"
    assert [attempt_head(n, 2, n - 1, 4) for n in (2, 3)] == [
        "Attempt 2 (1 of 4 in this job start)",
        "Attempt 3 (2 of 4 in this job start)",
    ]


def test_a_forced_resume_is_said_in_plain_words() -> None:
    forced = Resumed(run_id="r", checkpoint_seq=2, step=10, epoch=0, uri="file:///c/r/step-10", checkpoint_hash="0" * 64,
                     resume_count=1, forced=True)  # fmt: skip
    assert summary(forced) == "#1 from step 10 (while the log still saw it running)"

"""What `load()` settles before the first step, in one process: a run without a log whose checkpoints were all
set aside as corrupt never starts over."""

from pathlib import Path

import pytest

from ftrain.train.checkpointing import NoValidCheckpoint
from ftrain.workers.layout import complete_steps, set_asides
from tests.integration.test_training_api import _train

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script outside `ftrain run`: nothing from a supervisor, staging under the test's directory."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    for name in ("FTRAIN_RUN_ID", "FTRAIN_CKPT_DIR", "FTRAIN_CHECKPOINT_EVERY", "FTRAIN_DATASET_REVISION"):
        monkeypatch.delenv(name, raising=False)


def _corrupt_every_step(run: Path) -> list[int]:
    """Flip one byte of each checkpoint's shard: present and wrong, as a bad disk leaves it."""
    steps = complete_steps(run)
    for step in steps:
        shard = run / f"step-{step}" / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF
        shard.write_bytes(bytes(data))
    return steps


@pytest.mark.usefixtures("plain")
def test_a_run_without_a_log_whose_checkpoints_were_all_set_aside_never_starts_over(tmp_path: Path) -> None:
    """A new user's trial: plain torchrun, no run id; every checkpoint corrupt. The first start sets them
    aside and refuses; every later start is refused too (it trained from step 0 before), until one says
    resume=False; after that the new checkpoints are the run's."""
    run = tmp_path / "ckpt" / "trial"
    assert _train(run, 10)[0] == 10
    assert _corrupt_every_step(run) == [10, 5]
    for start in ("sets them aside", "finds only what was set aside", "still refuses"):
        with pytest.raises(NoValidCheckpoint) as refused:
            _train(run, 12)
        message = str(refused.value)
        assert message.startswith(f"no valid checkpoint in {run.as_uri()}: "), (start, message)
        assert "refusing to start over" in message and "start once with resume=False" in message, message
        assert [(s.step, s.kind) for s in set_asides(run)] == [(5, "corrupt"), (10, "corrupt")], start
        assert complete_steps(run) == [], start
    assert _train(run, 12, resume=False)[0] == 12  # on purpose: from step 0
    assert complete_steps(run) == [10, 5] and len(set_asides(run)) == 2, "the evidence stays"
    assert _train(run, 15)[0] == 15 and complete_steps(run) == [15, 10, 5]

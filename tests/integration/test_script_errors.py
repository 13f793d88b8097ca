"""The errors a training script catches: one tree under `ftrain.errors.FtrainError` (issue 34), raised by
`CheckpointManager.load()` against real storage and a real log."""

from pathlib import Path

import pytest
from torch import nn

from ftrain import errors
from ftrain.train.checkpointing import CheckpointManager
from tests.support.s3 import Endpoint

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "aws",
    [{"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, {"AWS_ACCESS_KEY_ID": "nobody"}],
    ids=["wrong-secret", "unknown-key"],
)
def test_credentials_the_store_refuses_stop_the_load_as_missing_credentials(
    weed: Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aws: dict[str, str]
) -> None:
    bucket = weed.new_bucket()
    for name, value in {**weed.env(), **aws}.items():
        monkeypatch.setenv(name, value)
    manager = CheckpointManager(
        f"s3://{bucket}/ckpt/run", model=nn.Linear(2, 2), stage_dir=tmp_path / "stage"
    )
    try:
        with pytest.raises(errors.MissingCredentials, match=r"set the storage's credentials") as raised:
            manager.load()
    finally:
        manager.close()
    assert isinstance(raised.value, errors.ResumeStopped) and isinstance(raised.value, errors.FtrainError)
    assert "\n" not in str(raised.value)


def test_an_unknown_run_is_refused_as_unknown_run(env: dict[str, str], tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt" / "nope", model=nn.Linear(2, 2), run_id="nope")
    try:
        with pytest.raises(
            errors.UnknownRun, match=r"^unknown run 'nope' in the event log: check the run id"
        ):
            manager.load()
    finally:
        manager.close()
    assert not (tmp_path / "ckpt" / "nope").exists() or not any((tmp_path / "ckpt" / "nope").iterdir())

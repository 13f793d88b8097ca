"""The errors a training script catches: one tree under `ftrain.errors.FtrainError` (issue 34), raised by
`CheckpointManager.load()` against real storage and a real log."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from ftrain import errors
from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.process_exit import STOPPED_EXIT
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


SCRIPT = """
import sys
from ftrain import errors
from ftrain.train.checkpointing import CheckpointManager
from ftrain.train.process_exit import STOPPED_EXIT
from ftrain.train.process_exit import run_then_exit

def main() -> None:
    raise errors.MissingCredentials("storage unavailable: s3://b/ckpt: NoCredentialsError: set them")

if sys.argv[1] == "run_then_exit":
    run_then_exit(main)
CheckpointManager(sys.argv[2])  # a script of its own: the manager makes an uncaught ftrain error one line
main()
"""


@pytest.mark.parametrize("way", ["run_then_exit", "uncaught"])
def test_an_ftrain_error_is_one_line_for_the_job_not_a_traceback_per_rank(tmp_path: Path, way: str) -> None:
    said = {}
    for rank in ("0", "1"):
        env = {**os.environ, "RANK": rank, "FTRAIN_HOME": str(tmp_path / "home")}
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, way, str(tmp_path / "ckpt" / rank)],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        said[rank] = (done.returncode, done.stderr)
    assert said == {
        "0": (
            STOPPED_EXIT,
            "train: MissingCredentials: storage unavailable: s3://b/ckpt: NoCredentialsError: set them\n",
        ),
        "1": (STOPPED_EXIT, ""),
    }

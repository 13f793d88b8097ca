"""The public training API's configuration as a user's script meets it, checked where it is made: arguments,
locations, the supervisor's settings, named states; and the README's snippet is the plain DDP example (the API
training in this process: tests/integration/test_training_api.py; the examples under `ftrain run`:
tests/e2e/test_training_api.py)."""

import os
import textwrap
from pathlib import Path

import msgspec
import pytest
from torch import nn

from ftrain.train.checkpointing import make_config
from ftrain.train.state import TrainState
from tests.support.paths import ROOT


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep": 1}, "keep=1: at least 2 checkpoints must be kept"),
        ({"keep": 0}, "keep=0: at least 2 checkpoints must be kept"),
        ({"every": "often"}, "every: --checkpoint-every 'often'"),
        ({"every": 0}, "save_interval=0"),
        ({"every": 2.5}, "every=2.5: a step count"),
        ({"run_id": "no spaces allowed"}, "run_id"),
        ({"world_change": "ignore"}, "world_change='ignore': 'refuse' or 'warn'"),
    ],
)
def test_a_bad_argument_is_a_value_error_naming_it(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        make_config(tmp_path / "run", env={}, **kwargs)  # type: ignore[arg-type]


def test_saves_hash_with_the_digest_ftrain_digest_names_and_a_bad_one_is_refused_before_anything_exists(
    tmp_path: Path,
) -> None:
    assert make_config(tmp_path / "run", env={}).digest == "sha256"
    assert make_config(tmp_path / "run", env={"FTRAIN_DIGEST": "blake3"}).digest == "blake3"
    with pytest.raises(ValueError, match=r"^FTRAIN_DIGEST='md5': use one of sha256, blake3$"):
        make_config(tmp_path / "run", env={"FTRAIN_DIGEST": "md5"})
    with pytest.raises(
        ValueError, match=r"^digest: digest algorithm 'crc32' is unknown: use one of sha256, blake3$"
    ):
        msgspec.structs.replace(make_config(tmp_path / "run", env={}), digest="crc32")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("location", "message"),
    [
        (None, "location: required outside `ftrain run`"),
        ("gs://bucket/run", "location: storage 'gs://bucket/run': scheme 'gs' is not supported"),
        ("s3://bucket", "location: checkpoint location 's3://bucket': name the run's own"),
        ("s3://b/run", "location: storage 's3://b/run': expected s3://bucket"),
    ],
)
def test_a_location_is_parsed_once_and_never_becomes_a_silent_local_path(
    location: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        make_config(location, env={})


def test_an_s3_location_is_object_storage_and_async_saves_get_a_private_stage_dir(tmp_path: Path) -> None:
    config = make_config("s3://ftrain/exp/my-run", async_save=True, env={})
    assert (config.location.backend, config.location.root, config.location.run) == (
        "s3",
        "s3://ftrain/exp",
        "my-run",
    )
    assert (
        config.stage_dir.name.startswith("my-run-")
        and config.stage_dir.parent.name == f"ftrain-{os.getuid()}"
    )
    local = make_config(tmp_path / "run", env={"SLURM_JOB_ID": "4242"})
    assert local.location.path == tmp_path / "run" and local.stage_dir.name == "4242"


def test_a_run_of_the_same_id_on_another_store_never_shares_the_stage_dir(tmp_path: Path) -> None:
    """Run ids repeat (every `ftrain demo` is dist-demo-1x2): a rank's start-up cleanup of its staging
    must never remove another run's. The same run on the same store finds its own again."""

    def stage(location: str | Path, **env: str) -> Path:
        return make_config(location, async_save=True, env=env).stage_dir

    bucket = "s3://ftrain/exp/my-run"
    assert stage(bucket, AWS_ENDPOINT_URL="http://a:1") == stage(bucket, AWS_ENDPOINT_URL="http://a:1")
    assert len({
        stage(bucket, AWS_ENDPOINT_URL="http://a:1"),
        stage(bucket, AWS_ENDPOINT_URL="http://b:1"),
        stage(bucket, AWS_CONFIG_FILE="/home/u/other/config"),
        stage("s3://ftrain/other/my-run"),
        stage(tmp_path / "one" / "my-run"),
        stage(tmp_path / "two" / "my-run"),
    }) == 6  # fmt: skip
    assert stage(tmp_path / "one" / "my-run", AWS_ENDPOINT_URL="http://a:1") == stage(
        tmp_path / "one" / "my-run"
    )


def test_under_ftrain_run_the_supervisors_run_location_cadence_and_revision_win(tmp_path: Path) -> None:
    env = {
        "FTRAIN_RUN_ID": "sup-1",
        "FTRAIN_CKPT_DIR": str(tmp_path / "sup-1"),
        "FTRAIN_CHECKPOINT_EVERY": "25steps",
        "FTRAIN_DATASET_REVISION": "A1-rev",
    }
    config = make_config(tmp_path / "mine", every=10, dataset_revision="mine", run_id="mine", env=env)
    assert (config.run_id, config.location.path, config.save_interval, config.dataset_revision) == (
        "sup-1", tmp_path / "sup-1", 25, "A1-rev",
    )  # fmt: skip
    timed = make_config(None, env={**env, "FTRAIN_CHECKPOINT_EVERY": "1h"})
    assert (timed.save_interval, timed.every_seconds) == (None, 3600.0)


def test_named_states_must_be_stateful_and_keep_clear_of_ftrains_keys() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"^states\['progress'\]: the name is ftrain's own"):
        TrainState(model, None, {"progress": model}, 0)
    with pytest.raises(ValueError, match=r"^states\['counter'\]: a int has no state_dict"):
        TrainState(model, None, {"counter": 3}, 0)  # type: ignore[dict-item]


def test_the_readme_snippet_is_the_plain_ddp_example_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.partition("## Your own training script")[2].partition("\n## ")[0]
    block = section.partition("```python\n")[2].partition("```")[0]
    assert block.strip(), "the README's own-script section has no python block"
    example = (ROOT / "ftrain" / "examples" / "ddp.py").read_text()
    body = textwrap.dedent(block)
    assert textwrap.indent(body, "    ") in example or body in example, "the README's snippet is not ddp.py's"
    assert len(body.strip().splitlines()) <= 20


@pytest.mark.parametrize(
    ("every", "rank", "said"),
    [(5, "0", True), ("2min", "0", True), (None, "0", False), ("10min", "0", False), (5, "1", False)],
)
def test_the_launch_cadence_wins_and_rank_0_says_what_it_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], every: int | str | None, rank: str, said: bool
) -> None:
    env = {"FTRAIN_CHECKPOINT_EVERY": "10min", "RANK": rank}
    config = make_config(tmp_path / "run", every=every, env=env)
    assert (config.save_interval, config.every_seconds) == (None, 600.0)
    expected = (
        f"train: checkpoint cadence 10min (`ftrain run --checkpoint-every`) replaces every={every!r} given in "
        "the script\n"
    )
    assert capsys.readouterr().err == (expected if said else "")

"""The command line's side of `ftrain.settings`: a malformed setting is refused by the real console script in
one line, exit 2, before anything starts or is written (the parsing itself:
tests/unit/test_settings_parsing.py)."""

from pathlib import Path

import pytest

from tests.support.processes import ftrain_process
from tests.unit.test_settings_parsing import NOT_UTF8


@pytest.mark.parametrize(
    ("variable", "value"), [("FTRAIN_STREAM_REPLICAS", "9"), ("FTRAIN_LOG_LEVEL", "loud")]
)
def test_the_cli_refuses_a_malformed_setting_in_one_line_with_exit_2(
    tmp_path: Path, variable: str, value: str
) -> None:
    done = ftrain_process(["list"], {"FTRAIN_HOME": str(tmp_path / "home"), variable: value})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"ftrain list: error: {variable}")
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "home").exists()  # refused before anything started or was written


@pytest.mark.parametrize("storage", ["file:///data/ckpt-%FF", NOT_UTF8])
def test_the_cli_refuses_a_storage_that_is_not_utf8_before_a_launch(
    env: dict[str, str], storage: str, tmp_path: Path
) -> None:
    done = ftrain_process(["launch", "P", "--nodes", "1", "--gpus-per-node", "1", "--nodelist", "n1"],
                          {**env, "FTRAIN_STORAGE": storage})  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith("ftrain launch: error: FTRAIN_STORAGE") and done.stderr.count("\n") == 1
    listed = ftrain_process(["list", "--json"], env)
    assert listed.returncode == 0 and "dist-P" not in listed.stdout  # nothing was launched

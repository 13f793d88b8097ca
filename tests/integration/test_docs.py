"""The docs cannot rot: every command and Python block of README.md and docs/ not marked `e2e` runs as
written, each page's in order, and the site builds strict (the convention: tests/support/docs.py; the `e2e`
blocks: tests/e2e/test_docs.py)."""

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.docs import BIN, RUN, Block, Scratch, by_page, page_name, page_runs_as_written
from tests.support.docs import scratch as scratch  # the fixture
from tests.support.paths import ROOT


@pytest.mark.parametrize("page", by_page([b for b in RUN if not b.e2e]), ids=page_name)
def test_the_page_runs_as_written(page: list[Block], scratch: Scratch) -> None:
    page_runs_as_written(page, scratch)


def test_the_site_builds_strict_with_every_page_in_the_nav(tmp_path: Path) -> None:
    built = subprocess.run(
        [BIN / "mkdocs", "build", "--strict", "--quiet", "--site-dir", tmp_path / "site"],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    reference = (tmp_path / "site" / "cli-reference" / "index.html").read_text()
    for command in ("ftrain run", "ftrain audit verify", "ftrain events tail"):
        assert f"<code>{command}</code>" in reference, command
    assert (
        "ftrain.train.checkpointing.CheckpointManager"
        in (tmp_path / "site" / "api" / "index.html").read_text()
    )
